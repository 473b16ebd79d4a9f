//! A provider's answers in the executor's vocabulary: which status and body make a call
//! `Succeeded`, `Failed` or `Unknown`, and a lookup `Succeeded`, `NotFound` or `Unknown`.

use hyper::StatusCode;
use outbox_core::{CallOutcome, LookupOutcome};

use crate::NO_PAYOUT_FOR_KEY;

/// How much of a provider's answer body goes into a `Failed` / `Unknown` reason.
const REASON_BODY_CHARS: usize = 300;

/// Cuts a provider answer to a length fit for a reason string.
pub(crate) fn clip(s: &str) -> String {
    match s.char_indices().nth(REASON_BODY_CHARS) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_owned(),
    }
}

/// The `payout_id` of a payout JSON answer.
fn payout_id(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let id = v.get("payout_id")?.as_str()?;
    (!id.is_empty()).then(|| id.to_owned())
}

/// Maps a `POST /payouts` answer to a call outcome.
pub(crate) fn call_outcome(status: StatusCode, body: &[u8]) -> CallOutcome {
    let text = clip(&String::from_utf8_lossy(body));
    if status == StatusCode::OK || status == StatusCode::CREATED {
        return match payout_id(body) {
            Some(reference) => CallOutcome::Succeeded { reference },
            None => CallOutcome::Unknown {
                reason: format!("provider answered {status} without a payout_id: {text}"),
            },
        };
    }
    // 408, 409 and 429 are 4xx but not refusals of the payout: the provider did not decide
    // (or will not say). 409 is what idempotency-key providers answer while a request with the
    // same key is still in progress. Reconciliation has to ask.
    if status.is_client_error()
        && status != StatusCode::REQUEST_TIMEOUT
        && status != StatusCode::CONFLICT
        && status != StatusCode::TOO_MANY_REQUESTS
    {
        return CallOutcome::Failed {
            reason: format!("provider refused the payout with {status}: {text}"),
        };
    }
    CallOutcome::Unknown {
        reason: format!("provider answered {status}: {text}"),
    }
}

/// Maps a `GET /payouts/by-key/{key}` answer to a lookup outcome.
pub(crate) fn lookup_outcome(status: StatusCode, body: &[u8]) -> LookupOutcome {
    let text = clip(&String::from_utf8_lossy(body));
    match status {
        StatusCode::OK => match payout_id(body) {
            Some(reference) => LookupOutcome::Succeeded { reference },
            None => LookupOutcome::Unknown {
                reason: format!("lookup answered 200 without a payout_id: {text}"),
            },
        },
        StatusCode::NOT_FOUND if is_no_payout_answer(body) => LookupOutcome::NotFound,
        _ => LookupOutcome::Unknown {
            reason: format!("lookup answered {status}: {text}"),
        },
    }
}

fn is_no_payout_answer(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("error")?.as_str().map(|e| e == NO_PAYOUT_FOR_KEY))
        .unwrap_or(false)
}
