use super::*;

fn check(_: &BrokerSettings) -> Result<(), BrokerError> {
    Ok(())
}
fn transport<'a>(
    url: &'a str,
    _: &'a BrokerSettings,
) -> BoxFuture<'a, Result<BoxTransport, BrokerError>> {
    Box::pin(async move { Err(BrokerError::connect("fake", url, "never connects")) })
}
fn source<'a>(
    url: &'a str,
    _: &'a BrokerSettings,
    _: &'a SourceOptions,
) -> BoxFuture<'a, Result<BoxSource, BrokerError>> {
    Box::pin(async move { Err(BrokerError::connect("fake", url, "never connects")) })
}
static FAKE: BrokerEntry = BrokerEntry {
    name: "fake",
    title: "Fake",
    schemes: &["fake", "fakes"],
    sections: &["fake"],
    reserved_headers: ReservedHeaders {
        prefixes: &["fake-"],
        names: &["fake"],
    },
    url_rules: UrlRules {
        schemes: &["fake", "fakes"],
        lone_userinfo_is_user: true,
        shown_params: &["mode"],
    },
    check,
    transport,
    source,
};
static OTHER: BrokerEntry = BrokerEntry {
    name: "other",
    title: "Other",
    schemes: &["other"],
    sections: &["other"],
    reserved_headers: ReservedHeaders {
        prefixes: &["other_"],
        names: &[],
    },
    url_rules: UrlRules::NONE,
    check,
    transport,
    source,
};

#[test]
fn the_registry_unites_its_entries_rules() {
    let r = Registry::new(&[&FAKE, &OTHER]);
    let reserved = r.reserved_headers();
    let msg = |name: &str| {
        crate::NewMessage::new("a", "b", 1, "C", crate::Payload::json(&1).unwrap())
            .with_header(name, "x")
    };
    for name in ["fake-id", "FAKE", "other_x"] {
        assert!(
            matches!(
                msg(name).validate_reserving(&reserved),
                Err(crate::MessageError::BadHeaderName(_))
            ),
            "{name}"
        );
    }
    assert_eq!(msg("fakes").validate_reserving(&reserved), Ok(()));
    assert!(Registry::new(&[]).reserved_headers().is_empty());
    let redactor = r.redactor();
    assert_eq!(
        redactor.redact("fake://u@h?mode=a&k=v,other://t0k@h?mode=a"),
        "fake://u@h?mode=a&k=***,other://***@h?mode=***"
    );
}

#[derive(Debug)]
struct Never;
impl std::fmt::Display for Never {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("never connects")
    }
}

#[test]
fn connect_errors_are_redacted_by_the_brokers_rules() {
    let e = BrokerError::connect("Fake", "fake://user@h?mode=a", Never);
    assert_eq!(
        e.to_string(),
        "cannot connect to Fake at fake://***@h?mode=***: never connects"
    );
    let e = BrokerError::connect_redacted(
        "Fake",
        FAKE.url_rules.redact("fake://user:pw@h?mode=a"),
        Never,
    );
    assert_eq!(
        e.to_string(),
        "cannot connect to Fake at fake://user:***@h?mode=a: never connects"
    );
}

#[tokio::test]
async fn an_unknown_scheme_names_the_supported_ones() {
    let r = Registry::new(&[&FAKE]);
    assert_eq!(r.find("FAKE://h").unwrap().name, "fake");
    let e = r.find("foo://x").unwrap_err();
    assert_eq!(
        e,
        BrokerError::UnknownScheme {
            scheme: "foo".into(),
            supported: "fake://, fakes://".into()
        }
    );
    assert!(e.to_string().contains("fake://, fakes://"), "{e}");
    for url in ["localhost:4222", "", "  ", "fake//u:secret@h"] {
        let e = r.find(url).unwrap_err();
        assert!(matches!(e, BrokerError::NoScheme { .. }), "{url}: {e:?}");
        let text = e.to_string();
        assert!(text.contains("has no scheme"), "{text}");
        assert!(text.contains("fake://, fakes://"), "{text}");
        assert!(!text.contains("secret"), "{text}");
    }
    let e = r
        .connect_transport("fakes://user:secret@h", &BrokerSettings::new())
        .await
        .unwrap_err();
    assert!(!e.to_string().contains("secret"), "{e}");
    let settings = BrokerSettings::new().with_section("natz", serde_json::json!({}));
    assert!(matches!(
        r.check(&settings),
        Err(BrokerError::UnknownSection { name, .. }) if name == "natz"
    ));
}

#[test]
fn sections_are_typed_and_files_are_checked() {
    #[derive(Debug, Default, serde::Deserialize)]
    #[serde(default, deny_unknown_fields)]
    struct S {
        stream: String,
    }
    let s = BrokerSettings::new().with_section("x", serde_json::json!({"streem": "a"}));
    let e = s.section::<S>("x").unwrap_err();
    assert!(e.to_string().contains("streem"), "{e}");
    assert_eq!(s.section::<S>("absent").unwrap().stream, "");
    // A broker's own file kind travels like the TLS ones.
    const SEED: &str = "seed_file";
    let mut s = BrokerSettings::new();
    s.set_file(SEED, "/seed".into());
    let e = s.accept_files("other", &[file::CA]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid configuration `other.seed_file`: other does not use a seed_file"
    );
    assert!(s.accept_files("fake", &[file::CA, SEED]).is_ok());
}
