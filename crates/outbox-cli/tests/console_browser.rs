//! The console in a real browser (headless Chromium from Debian's packages, driven over
//! WebDriver by fantoccini through chromedriver; `scripts/services` installs both): the overview's
//! numbers are the database's, a reason is shown as text, an action without the token is
//! refused, and a dead letter requeued through the page reaches the broker.
//!
//! With `OUTBOX_CONSOLE_SCREENSHOTS=<dir>` the test also saves the page's screenshots there
//! (the ones in docs/guide/src/console/ come from this test).
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use common::*;
use fantoccini::{Client, ClientBuilder, Locator};

const TOKEN: &str = "console-token-of-the-browser-test";
const QUICK: Duration = Duration::from_secs(30);
const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// chromedriver on a free port and a headless Chromium session through it.
struct Browser {
    client: Client,
    _driver: ChildGuard,
}

async fn browser() -> Browser {
    for bin in [CHROMIUM, CHROMEDRIVER] {
        assert!(
            std::path::Path::new(bin).exists(),
            "{bin} is required (Debian packages chromium and chromium-driver; scripts/services installs them)"
        );
    }
    let port = free_port();
    let mut cmd = std::process::Command::new(CHROMEDRIVER);
    cmd.arg(format!("--port={port}"));
    let driver = ChildGuard::spawn(cmd, "chromedriver");
    wait_until(QUICK, "chromedriver listens", || async move {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
    })
    .await;
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": CHROMIUM,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,900"],
        }),
    );
    let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
        .unwrap_or_else(|e| panic!("a Chromium session through chromedriver: {e}"));
    Browser {
        client,
        _driver: driver,
    }
}

/// `outbox console` on `db` with [`TOKEN`], and a browser showing its page.
async fn console_in_a_browser(db: &TestDb) -> (ChildGuard, Browser) {
    let (port, console) = spawn_console_with_token(db, TOKEN).await;
    let b = browser().await;
    b.client
        .goto(&format!("http://127.0.0.1:{port}/"))
        .await
        .expect("open the console");
    (console, b)
}

async fn text(client: &Client, css: &str) -> String {
    match client.find(Locator::Css(css)).await {
        Ok(e) => e.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// Waits until the element's text satisfies `ok`; returns that text.
async fn wait_text(client: &Client, css: &str, what: &str, ok: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + QUICK;
    loop {
        let t = text(client, css).await;
        if ok(&t) {
            return t;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: `{css}` still shows {t:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Scrolls the section holding the element `id` to the top of the window (below the page's
/// header), then takes [`screenshot`] `name`.
async fn screenshot_at(client: &Client, id: &str, name: &str) {
    client
        .execute(
            "document.getElementById(arguments[0]).closest('section').scrollIntoView(); \
             window.scrollBy(0, -80)",
            vec![serde_json::json!(id)],
        )
        .await
        .unwrap();
    screenshot(client, name).await;
}

async fn screenshot(client: &Client, name: &str) {
    if let Ok(dir) = std::env::var("OUTBOX_CONSOLE_SCREENSHOTS") {
        let png = client.screenshot().await.expect("screenshot");
        std::fs::create_dir_all(&dir).expect("screenshot dir");
        std::fs::write(std::path::Path::new(&dir).join(name), png).expect("write screenshot");
    }
}

#[tokio::test]
async fn the_console_page_shows_the_database_and_requeues_with_the_token_only() {
    let db = TestDb::new().await;
    let nats = NatsEnv::new().await;
    let subscriber = nats.stream_subscriber().await;
    let pending: Vec<_> = (1..=3).map(|i| event(&format!("acc-{i}"), 1)).collect();
    let (d1, behind, d2) = (event("bad-1", 1), event("bad-1", 2), event("bad-2", 1));
    let mut all = pending.clone();
    all.extend([d1.clone(), behind.clone(), d2.clone()]);
    db.enqueue(&all).await;
    db.exec(&db.sql(&format!(
        "UPDATE {{s}}.events SET state = 'dead', attempts = 5, \
         last_error = 'message too large <img src=x onerror=alert(1)>' \
         WHERE event_id IN ('{}', '{}')",
        d1.event_id, d2.event_id
    )))
    .await;

    let (mut console, b) = console_in_a_browser(&db).await;
    let c = &b.client;

    // The overview is the database's numbers.
    let db_pending = db.count("state = 'pending'").await;
    assert_eq!(db_pending, 4, "3 pending + 1 behind a dead letter");
    wait_text(c, "[data-field='pending']", "pending", |t| {
        t == db_pending.to_string()
    })
    .await;
    let db_dead = db.count("state = 'dead'").await;
    assert_eq!(
        text(c, "[data-field='dead_letters']").await,
        db_dead.to_string()
    );
    assert_eq!(text(c, "[data-field='in_flight']").await, "0");
    assert!(text(c, "#schema").await.contains(db.name()));
    // Per route: the aggregate type's row, with its pending rows and dead letters.
    let route = wait_text(c, "#routes tbody", "the route", |t| {
        t.contains("type payment")
    })
    .await;
    assert!(
        route.contains("type payment (topic template) 4 "),
        "{route}"
    );

    // The dead letters, their reasons as text (the markup in one is not markup on the page).
    let rows = c
        .find_all(Locator::Css("#dead-letters tbody tr"))
        .await
        .unwrap();
    assert_eq!(rows.len(), 2);
    let reason = text(c, &format!("tr[data-event-id='{}'] td.reason", d1.event_id)).await;
    assert_eq!(reason, "message too large <img src=x onerror=alert(1)>");
    assert!(
        c.find_all(Locator::Css("#dead-letters img"))
            .await
            .unwrap()
            .is_empty()
    );
    screenshot(c, "overview.png").await;

    // Without the token the action is refused, and nothing changes.
    let select_d1 = format!("tr[data-event-id='{}'] input", d1.event_id);
    click(c, &select_d1).await;
    act(c, "#requeue-selected", "the refusal", |t| {
        t.starts_with("refused:") && t.contains("needs the console token")
    })
    .await;
    assert_eq!(db.count("state = 'dead'").await, 2);

    c.find(Locator::Id("token"))
        .await
        .unwrap()
        .send_keys(TOKEN)
        .await
        .unwrap();
    click(c, "#token-save").await;
    // With the token, the route is paused from its row: the relay, started now, holds it.
    type_into(c, "#pause-reason", "payment sink maintenance").await;
    click(c, "#routes tr[data-route='type:payment'] button").await;
    wait_text(c, "#pauses tbody", "the pause", |t| {
        t.contains("type:payment") && t.contains("payment sink maintenance")
    })
    .await;
    let (stop, relay_task) = nats.start_relay(&db).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(subscriber.len(), 0, "the relay published a paused route");
    assert_eq!(db.count("state = 'pending'").await, 4);
    screenshot(c, "paused.png").await;
    act(c, "#pauses tbody button", "the resume", |t| {
        t == "resumed route type:payment"
    })
    .await;

    // The relay runs; with the token, the selected dead letter goes out under its own id,
    // then the event that waited behind it.
    let reason_box = c.find(Locator::Id("reason")).await.unwrap();
    reason_box.send_keys("broker limit raised").await.unwrap();
    // Still selected from before (the page's refresh keeps a selection).
    let selected = c
        .execute(
            &format!("return document.querySelector(\"{select_d1}\").checked"),
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(selected, serde_json::json!(true));
    act(c, "#requeue-selected", "the requeue", |t| t == "requeued 1").await;
    let seen = subscriber
        .wait_ids(
            &[
                pending[0].event_id,
                pending[1].event_id,
                pending[2].event_id,
                d1.event_id,
                behind.event_id,
            ],
            Duration::from_secs(20),
        )
        .await;
    let bad_1: Vec<_> = seen
        .iter()
        .filter(|r| r.aggregate_id == "bad-1")
        .map(|r| r.event_id)
        .collect();
    assert_eq!(bad_1, vec![d1.event_id, behind.event_id]);
    assert!(seen.iter().all(|r| r.event_id != d2.event_id));

    // The page catches up: one dead letter left, nothing pending.
    wait_text(c, "[data-field='dead_letters']", "dead letters", |t| {
        t == "1"
    })
    .await;
    wait_text(c, "[data-field='pending']", "pending", |t| t == "0").await;
    // The relay's heartbeat, and the publishes it reported for the route: the three pending
    // events, the requeued one and the one behind it.
    wait_text(c, "#instances tbody", "the relay", |t| {
        t.starts_with("up relay polling")
    })
    .await;
    wait_text(c, "#routes tbody", "the route's publishes", |t| {
        t.trim_end_matches("pause").trim_end().ends_with(" 5")
    })
    .await;
    screenshot(c, "after-requeue.png").await;
    // Its heartbeat also recorded what its gauges read: the dead letters per minute, 2 before
    // the requeue or 1 after it (whichever minute's highest reading the chart shows).
    wait_text(
        c,
        "#activity-dead_letters tr[data-series='outbox'] td.peak",
        "the relay's dead-letter reading",
        |t| t == "2" || t == "1",
    )
    .await;

    stop.cancel();
    relay_task.await.expect("relay task");
    b.client.close().await.expect("close the browser");
    let exit = console.terminate().await;
    assert!(exit.success(), "{exit:?}");
    assert!(console.log().contains("broker limit raised"));
    db.drop().await;
}

/// Clicks the element; again when the page's refresh (every 5 s) replaced it between the
/// find and the click.
async fn click(c: &Client, css: &str) {
    click_at(c, Locator::Css(css)).await;
}

async fn click_at(c: &Client, at: Locator<'_>) {
    let css = format!("{at:?}");
    for attempt in 0.. {
        let result = match c.find(at).await {
            Ok(e) => e.click().await,
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => return,
            Err(e) if attempt < 20 => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("click `{css}`: {e}"),
        }
    }
}

/// Clicks the button `css`, then waits until the page's action result satisfies `ok`.
async fn act(c: &Client, css: &str, what: &str, ok: impl Fn(&str) -> bool) {
    click(c, css).await;
    wait_text(c, "#action-result", what, ok).await;
}

/// Opens the tab `tab`, then waits until the element `css` satisfies `ok`; returns its text.
async fn open_tab(
    c: &Client,
    tab: &str,
    css: &str,
    what: &str,
    ok: impl Fn(&str) -> bool,
) -> String {
    click(c, &format!("#tabs [data-tab='{tab}']")).await;
    wait_text(c, css, what, ok).await
}

/// The heartbeat of a process of `kind` named `name` on `db`'s schema.
fn heartbeat(
    db: &TestDb,
    kind: outbox_postgres::heartbeat::InstanceKind,
    name: &str,
) -> outbox_postgres::heartbeat::Heartbeat {
    outbox_postgres::heartbeat::Heartbeat::new(db.store(), kind, name).unwrap()
}

async fn type_into(c: &Client, css: &str, text: &str) {
    let e = c.find(Locator::Css(css)).await.unwrap();
    e.clear().await.unwrap();
    e.send_keys(text).await.unwrap();
}

#[tokio::test]
async fn the_console_groups_discards_compares_reconciles_traces_and_audits() {
    let db = TestDb::new().await;
    let (big, slow, first) = (event("big-1", 1), event("slow-1", 1), event("paid-1", 1));
    db.enqueue(&[big.clone(), slow.clone(), first.clone()])
        .await;
    let received = r#"{"note":"<img src=x onerror=alert(1)>"}"#;
    db.exec(&format!(
        "UPDATE {{s}}.events SET state = 'dead', attempts = 5, last_error = CASE event_id \
           WHEN '{big}' THEN 'message of 2000000 bytes is too large' \
           ELSE 'publish timed out after 5000 ms' END \
         WHERE event_id IN ('{big}', '{slow}')",
        big = big.event_id,
        slow = slow.event_id,
    ))
    .await;
    // A conflict on `first`, whose first payload the outbox still holds.
    db.exec(&format!(
        "INSERT INTO {{s}}.inbox_conflicts (consumer_name, event_id, stored_sha256, \
           received_sha256, aggregate_type, aggregate_id, aggregate_version, event_type, payload) \
         SELECT 'ledger', event_id, payload_sha256, sha256(convert_to('{received}', 'UTF8')), \
           aggregate_type, aggregate_id, aggregate_version, event_type, \
           convert_to('{received}', 'UTF8') \
         FROM {{s}}.events WHERE event_id = '{first}'",
        first = first.event_id,
    ))
    .await;
    db.exec(
        "INSERT INTO {s}.work_items (kind, idempotency_key, payload, state, unknown_since, \
           next_attempt_at) VALUES ('payout', 'payout-7', '{\"amount\": 7}', 'unknown', now(), \
           now() + interval '1 hour')",
    )
    .await;

    // A consumer's heartbeat, as a service embedding one runs it.
    let beat_stop = tokio_util::sync::CancellationToken::new();
    let beat = tokio::spawn(
        heartbeat(
            &db,
            outbox_postgres::heartbeat::InstanceKind::Consumer,
            "ledger",
        )
        .with_stats(|| serde_json::json!({ "applied": 42 }))
        .run(beat_stop.clone()),
    );
    // A relay whose broker refuses: its engine's health says so (as `Relay::health` does).
    let health = std::sync::Arc::new(outbox_core::health::Health::new());
    health.failed(
        outbox_core::health::TroubleKind::Publish,
        3,
        &"attempt 3: Unavailable: broker <b>down</b>",
    );
    let relay_beat = tokio::spawn(
        heartbeat(
            &db,
            outbox_postgres::heartbeat::InstanceKind::Relay,
            "polling",
        )
        .with_health(health)
        .run(beat_stop.clone()),
    );

    let (mut console, b) = console_in_a_browser(&db).await;
    let c = &b.client;
    let process = wait_text(c, "#instances tbody", "both heartbeats", |t| {
        t.contains("ledger") && t.contains("polling")
    })
    .await;
    assert!(process.starts_with("up consumer ledger"), "{process}");
    // Readable, not raw JSON: the consumer's own number in words, the relay's state and its
    // last error as text (never markup), with its age and the errors of the last minute.
    assert!(process.contains("applied 42"), "{process}");
    assert!(!process.contains('{'), "{process}");
    let relay = c
        .find(Locator::Css("#instances tbody tr[data-state='failing']"))
        .await
        .expect("the failing relay's row")
        .text()
        .await
        .unwrap();
    assert!(relay.starts_with("up relay polling failing"), "{relay}");
    assert!(
        relay.contains("none since it started")
            && relay.contains(" ago · publish: attempt 3: Unavailable: broker <b>down</b>"),
        "{relay}"
    );
    let rate = text(c, "#instances tbody tr[data-state='failing'] td.errors").await;
    assert_eq!(rate, "3");
    assert!(
        c.find_all(Locator::Css("#instances b"))
            .await
            .unwrap()
            .is_empty(),
        "the error went in as text"
    );
    screenshot_at(c, "instances-title", "processes.png").await;
    type_into(c, "#actor", "dana").await;
    type_into(c, "#token", TOKEN).await;
    click(c, "#token-save").await;

    // Grouped by reason, numbers as #; a group narrows the list.
    wait_text(c, "#dead-groups tbody", "two reason groups", |t| {
        t.contains("message of # bytes is too large") && t.contains("publish timed out after # ms")
    })
    .await;
    screenshot(c, "dead-letter-groups.png").await;
    let groups = c
        .find_all(Locator::Css("#dead-groups tbody tr"))
        .await
        .unwrap();
    assert_eq!(groups.len(), 2);
    let too_large = format!("tr[data-event-id='{}']", big.event_id);
    click_at(
        c,
        Locator::XPath("//table[@id='dead-groups']//tr[contains(., 'too large')]//button"),
    )
    .await;
    wait_text(c, "#dead-letters tbody", "the group's dead letters", |t| {
        t.contains("big-1") && !t.contains("slow-1")
    })
    .await;

    // Its payload, as text; then discarded with a reason.
    click(c, &format!("{too_large} button")).await;
    wait_text(c, "#dead-detail", "the payload", |t| {
        t.contains(r#""agg": "big-1""#)
    })
    .await;
    click(c, &format!("{too_large} input")).await;
    type_into(c, "#reason", "the order was cancelled").await;
    click(c, "#discard-selected").await;
    c.accept_alert().await.expect("the discard's confirmation");
    wait_text(c, "#action-result", "the discard", |t| t == "discarded 1").await;
    assert_eq!(db.count(&format!("event_id = '{}'", big.event_id)).await, 0);
    let kept = db
        .scalar(&format!(
            "SELECT count(*) FROM {{s}}.discarded_events WHERE event_id = '{}'",
            big.event_id
        ))
        .await;
    assert_eq!(kept, 1);

    // The conflict: both payloads side by side, the received one as text, never as markup.
    open_tab(c, "consumers", "#conflicts tbody", "the conflict", |t| {
        t.contains("ledger")
    })
    .await;
    click(c, "#conflicts tbody button").await;
    let side = wait_text(c, "#conflict-detail .side-by-side", "both payloads", |t| {
        t.contains("paid-1") && t.contains("onerror")
    })
    .await;
    assert!(side.contains("<img src=x onerror=alert(1)>"), "{side}");
    assert!(
        c.find_all(Locator::Css("#conflict-detail img"))
            .await
            .unwrap()
            .is_empty()
    );
    screenshot(c, "conflict.png").await;
    // Resolved with a reason from its row: it leaves the open count, shown as resolved.
    type_into(c, "#conflict-reason", "producer fixed").await;
    act(c, "#conflicts tbody td button + button", "resolve", |t| {
        t == "resolved 1 conflict(s)"
    })
    .await;
    wait_text(c, "#conflicts tbody", "the resolved conflict", |t| {
        t.contains("resolved") && t.contains("producer fixed")
    })
    .await;
    let open = db
        .scalar("SELECT count(*) FROM {s}.inbox_conflicts WHERE resolved_at IS NULL")
        .await;
    assert_eq!(open, 0);

    // The unknown outcome: reconcile now.
    open_tab(c, "effects", "#work-items tbody", "the work item", |t| {
        t.contains("payout-7")
    })
    .await;
    screenshot(c, "work-items.png").await;
    act(c, "#work-items tbody button", "reconcile", |t| {
        t.ends_with("lookup due now")
    })
    .await;
    let due = db
        .scalar("SELECT count(*) FROM {s}.work_items WHERE next_attempt_at <= now()")
        .await;
    assert_eq!(due, 1);

    // The discarded event's trace.
    click(c, "#tabs [data-tab='trace']").await;
    type_into(c, "#trace-event-id", &big.event_id.to_string()).await;
    click(c, "#trace-form button").await;
    let trace = wait_text(c, "#trace-result", "the trace", |t| {
        t.contains("discarded by an operator")
    })
    .await;
    assert!(trace.contains("discarded by an operator"), "{trace}");
    assert!(trace.contains("the order was cancelled"), "{trace}");
    screenshot(c, "trace.png").await;

    // The audit: both actions, by the name typed, with the token's fingerprint.
    let audit = open_tab(c, "audit", "#audit tbody", "the audit", |t| {
        t.contains("reconcile work item") && t.contains("discard dead letters")
    })
    .await;
    assert!(audit.contains("dana (token "), "{audit}");
    assert!(!audit.contains(TOKEN));
    screenshot(c, "audit.png").await;

    beat_stop.cancel();
    beat.await.unwrap();
    relay_beat.await.unwrap();
    b.client.close().await.expect("close the browser");
    let exit = console.terminate().await;
    assert!(exit.success(), "{exit:?}");
    db.drop().await;
}

/// The bars of the activity chart in `row`, oldest first: each bar's count (its title) for the
/// bars drawn above zero, and how many bars (minutes) the chart has.
async fn bars(c: &Client, row: &str) -> (Vec<i64>, usize) {
    let (counts, _, _, minutes) = drawn(c, row).await;
    (counts, minutes)
}

/// Where the bars above zero of the chart in `row` stand: the minutes between each and the
/// next (a minute turning moves all of them, not the gaps), and each one's height as a share
/// of the tallest, in hundredths.
async fn layout(c: &Client, row: &str) -> (Vec<usize>, Vec<u32>) {
    let (_, slots, heights, _) = drawn(c, row).await;
    let gaps = slots.windows(2).map(|w| w[1] - w[0]).collect();
    let tallest = heights.iter().copied().fold(0.0, f64::max);
    let shares = heights
        .iter()
        .map(|h| (h / tallest * 100.0).round() as u32)
        .collect();
    (gaps, shares)
}

/// The chart in `row` as drawn: the counts (titles), minute slots and heights of the bars above
/// zero, oldest first, and how many bars (minutes) it has.
async fn drawn(c: &Client, row: &str) -> (Vec<i64>, Vec<usize>, Vec<f64>, usize) {
    let got = c
        .execute(
            "const rects = [...document.querySelectorAll(arguments[0] + ' svg rect')];\n\
             const up = rects.map((r, i) => [r, i])\n\
                             .filter(([r]) => Number(r.getAttribute('height')) > 0);\n\
             return [up.map(([r]) => Number(r.textContent.split(' ')[0])), up.map(([, i]) => i),\n\
                     up.map(([r]) => Number(r.getAttribute('height'))), rects.length];",
            vec![serde_json::json!(row)],
        )
        .await
        .unwrap();
    serde_json::from_value(got).unwrap()
}

/// Chooses `minutes` in the window menu `select` (the page reads the activity again).
async fn choose_window(c: &Client, select: &str, minutes: &str) {
    c.find(Locator::Css(select))
        .await
        .unwrap()
        .select_by_value(minutes)
        .await
        .unwrap();
}

/// The activity charts draw what the heartbeats recorded, over the window the operator
/// chooses: counts the test writes into `activity` (a route's publishes 0, 5, 30, 50 and 90
/// minutes ago, a consumer's effects) are the charts' bars, totals and busiest minutes; the
/// levels (the oldest pending age, the dead letters, a consumer's lag), earlier minutes
/// written as rows and this minute's three readings through the heartbeats' store, are bars of
/// each minute's highest reading, with no total. The minutes are chosen so that a minute turning
/// during the test moves every bar by one without moving any across a window's edge.
#[tokio::test]
async fn the_console_charts_the_activity_the_heartbeats_recorded() {
    let db = TestDb::new().await;
    // Every row in one statement: one `now()`, so a minute turning cannot move some of them.
    let row = |kind: &str, name: &str, ago: i64, count: i64| {
        format!(
            "(date_trunc('minute', now()) - make_interval(mins => {ago}), '{kind}', '{name}', {count})"
        )
    };
    let mut rows: Vec<String> = [(0, 7), (5, 11), (30, 13), (50, 17), (90, 19)]
        .into_iter()
        .map(|(ago, count)| row("publish", "destination:payments.charts", ago, count))
        .collect();
    rows.extend([
        row("publish", "type:refund", 3, 2),
        row("consume", "ledger", 2, 5),
        row("consume", "ledger", 40, 4),
        row("oldest_pending_age", "outbox", 20, 300),
        row("dead_letters", "outbox", 2, 6),
        row("lag", "ledger", 10, 30),
    ]);
    db.exec(format!(
        "INSERT INTO {{s}}.activity (minute, kind, name, count) VALUES {}",
        rows.join(", ")
    ))
    .await;
    let now = |kind, name: &str, value| outbox_core::heartbeat::ActivityEntry {
        kind,
        name: name.to_owned(),
        value,
    };
    {
        use outbox_core::heartbeat::HeartbeatStore as _;
        use outbox_core::operator::ActivityKind::{Lag, OldestPendingAge};
        // Three beats' readings in one statement (one minute whatever the clock does),
        // merged by the store as three statements would be.
        let levels = [(40, 3), (45, 12), (41, 8)]
            .into_iter()
            .flat_map(|(age, lag)| {
                [
                    now(OldestPendingAge, "outbox", age),
                    now(Lag, "ledger", lag),
                ]
            })
            .collect();
        db.store().add_activity(levels).await.unwrap();
    }

    let (mut console, b) = console_in_a_browser(&db).await;
    let c = &b.client;
    let row = "#activity-publish tr[data-series='destination:payments.charts']";

    // The last hour, the default: four of the five minutes, oldest first.
    wait_text(c, &format!("{row} td.total"), "the hour's total", |t| {
        t == "48"
    })
    .await;
    assert_eq!(text(c, &format!("{row} td.peak")).await, "17");
    assert_eq!(bars(c, row).await, (vec![17, 13, 11, 7], 60));
    // In their minutes (50, 30, 5 and 0 minutes ago), as tall as their counts.
    assert_eq!(
        layout(c, row).await,
        (vec![20, 25, 5], vec![100, 76, 65, 41])
    );
    // Busiest first: the other route after it.
    let order = text(c, "#activity-publish tbody").await;
    let (charts, refund) = (
        order.find("payments.charts").unwrap(),
        order.find("type refund (topic template)").unwrap(),
    );
    assert!(charts < refund, "{order}");
    screenshot(c, "activity.png").await;

    // Two hours: the fifth minute too. A quarter of an hour: only the last two.
    choose_window(c, "#activity-publish-minutes", "120").await;
    wait_text(c, &format!("{row} td.total"), "two hours' total", |t| {
        t == "67"
    })
    .await;
    assert_eq!(bars(c, row).await, (vec![19, 17, 13, 11, 7], 120));
    assert_eq!(layout(c, row).await.0, [40, 20, 25, 5]);
    choose_window(c, "#activity-publish-minutes", "15").await;
    wait_text(c, &format!("{row} td.total"), "15 minutes' total", |t| {
        t == "18"
    })
    .await;
    assert_eq!(bars(c, row).await, (vec![11, 7], 15));

    // The levels: each minute's highest reading, the window's highest, no total.
    let age = "#activity-oldest_pending_age tr[data-series='outbox']";
    wait_text(c, &format!("{age} td.peak"), "the highest age", |t| {
        t == "300"
    })
    .await;
    assert_eq!(bars(c, age).await, (vec![300, 45], 60));
    let dead = "#activity-dead_letters tr[data-series='outbox']";
    assert_eq!(text(c, &format!("{dead} td.peak")).await, "6");
    assert_eq!(bars(c, dead).await, (vec![6], 60));
    let totals = c
        .find_all(Locator::Css(&format!(
            "{age} td.total, {dead} td.total, #activity-oldest_pending_age th.total"
        )))
        .await
        .unwrap();
    assert!(totals.is_empty(), "a level has no total");
    screenshot_at(c, "activity-oldest_pending_age", "levels.png").await;

    // The consumers' tab: the effects the consumer applied.
    let ledger = "#activity-consume tr[data-series='ledger']";
    open_tab(
        c,
        "consumers",
        &format!("{ledger} td.total"),
        "the consumer's hour",
        |t| t == "9",
    )
    .await;
    assert_eq!(bars(c, ledger).await, (vec![4, 5], 60));
    let lag = "#activity-lag tr[data-series='ledger']";
    assert_eq!(text(c, &format!("{lag} td.peak")).await, "30");
    assert_eq!(bars(c, lag).await, (vec![30, 12], 60));
    screenshot_at(c, "activity-consume", "consumer-charts.png").await;

    b.client.close().await.expect("close the browser");
    let exit = console.terminate().await;
    assert!(exit.success(), "{exit:?}");
    db.drop().await;
}
