//! Kafka topic names: what a topic may be called, and how a template's placeholders are made
//! legal.

/// Longest topic name Kafka accepts.
pub const MAX_TOPIC_CHARS: usize = 249;

/// Placeholders a topic template may contain.
pub(crate) const PLACEHOLDERS: [&str; 3] = ["{aggregate_type}", "{aggregate_id}", "{event_type}"];

fn is_legal(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// `value` with every character a topic name cannot hold turned into `_` (an empty value
/// becomes `_`), for a template placeholder.
pub fn sanitize_token(value: &str) -> String {
    if value.is_empty() {
        return "_".to_owned();
    }
    value
        .chars()
        .map(|c| if is_legal(c) { c } else { '_' })
        .collect()
}

/// Checks a literal topic name as Kafka does: 1 to 249 characters of ASCII letters, digits,
/// `.`, `_` and `-`, and neither `.` nor `..`.
///
/// # Errors
/// What is wrong, as a sentence.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("a topic name must not be empty".into());
    }
    if name == "." || name == ".." {
        return Err(format!("`{name}` is not a valid topic name"));
    }
    let len = name.chars().count();
    if len > MAX_TOPIC_CHARS {
        return Err(format!(
            "a topic name has at most {MAX_TOPIC_CHARS} characters (got {len})"
        ));
    }
    if let Some(c) = name.chars().find(|c| !is_legal(*c)) {
        return Err(format!(
            "a topic name holds only ASCII letters, digits, `.`, `_` and `-` (found {:?})",
            c
        ));
    }
    Ok(())
}

/// Checks a topic template: only the known placeholders, and a legal name once they are
/// filled in.
///
/// # Errors
/// What is wrong, as a sentence.
pub fn check_template(template: &str) -> Result<(), String> {
    let mut sample = template.to_owned();
    for p in PLACEHOLDERS {
        sample = sample.replace(p, "x");
    }
    if sample.contains(['{', '}']) {
        return Err(format!(
            "`{template}` has an unknown placeholder; use {}",
            PLACEHOLDERS.join(", ")
        ));
    }
    check_name(&sample).map_err(|why| format!("`{template}`: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_kafkas_rules() {
        for ok in ["outbox.payment", "a", "A-b_c.9", &"x".repeat(249)] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".", "..", "a b", "a/b", "ä", &"x".repeat(250), "a*"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn placeholders_are_made_legal() {
        assert_eq!(sanitize_token("Payment Order/EU"), "Payment_Order_EU");
        assert_eq!(sanitize_token("ставка"), "______");
        assert_eq!(sanitize_token(""), "_");
        assert!(check_template("outbox.{aggregate_type}.{event_type}").is_ok());
        assert!(check_template("outbox.{tenant}").is_err());
        assert!(check_template("out box.{aggregate_type}").is_err());
    }
}
