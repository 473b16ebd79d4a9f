//! `outbox --help` keeps operator commands and test tools apart: the test tools (built in with
//! the `harness` feature, as CI's test build is) are not in the command list, and are listed in
//! a section of their own; a build without the feature says that it has none.
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use common::*;

#[tokio::test]
async fn help_lists_operator_commands_and_test_tools_apart() {
    let mut cmd = outbox(None, None, None);
    cmd.arg("--help");
    let r = run(cmd, Duration::from_secs(30)).await;
    assert!(r.status.success(), "{}", r.stderr);
    let commands = r
        .stdout
        .split_once("Commands:")
        .and_then(|(_, rest)| rest.split_once("Options:"))
        .map(|(list, _)| list)
        .expect("a command list");
    for operator in [
        "migrate",
        "relay",
        "status",
        "dead-letters",
        "conflicts",
        "consumer-dead-letters",
        "cleanup",
        "effects",
        "roles",
        "debezium",
    ] {
        assert!(
            commands.contains(operator),
            "{operator} missing:\n{commands}"
        );
    }
    #[cfg(feature = "harness")]
    harness_tools_listed_apart(&r.stdout, commands).await;
    #[cfg(not(feature = "harness"))]
    {
        assert!(
            r.stdout.contains("--features harness"),
            "a production build names the feature that has the test tools:\n{}",
            r.stdout
        );
        for tool in ["crash-matrix", "demo"] {
            assert!(!commands.contains(tool), "{tool} in a production build");
        }
        let mut cmd = outbox(None, None, None);
        cmd.args(["crash-matrix", "--list"]);
        let r = run(cmd, Duration::from_secs(30)).await;
        assert!(!r.status.success(), "crash-matrix ran without the harness");
    }
}

#[cfg(feature = "harness")]
async fn harness_tools_listed_apart(stdout: &str, commands: &str) {
    let tools = stdout
        .split_once("Test tools")
        .map(|(_, rest)| rest)
        .expect("a test tools section");
    for tool in [
        "crash-matrix",
        "demo",
        "demo-consumer",
        "demo-producer",
        "demo-provider",
    ] {
        assert!(
            !commands.contains(tool),
            "{tool} is in the operator list:\n{commands}"
        );
        assert!(tools.contains(tool), "{tool} missing:\n{tools}");
    }
    // Hidden from the list, still runnable.
    let mut cmd = outbox(None, None, None);
    cmd.args(["crash-matrix", "--list"]);
    let r = run(cmd, Duration::from_secs(30)).await;
    assert!(r.status.success(), "{}", r.stderr);
    assert!(r.stdout.contains("relay.after_publish"), "{}", r.stdout);
}

/// Shell completions and the manual page come from the command definition itself, and need
/// no database (an unreachable one here) or configuration.
#[tokio::test]
async fn completions_and_the_manual_page_are_generated_from_the_commands() {
    for shell in ["bash", "zsh", "fish"] {
        let mut cmd = outbox(None, None, None);
        cmd.args(["completions", shell])
            .env("OUTBOX_DATABASE_URL", "postgres://nobody@127.0.0.1:1/none");
        let r = run(cmd, Duration::from_secs(30)).await;
        assert!(r.status.success(), "{shell}: {}", r.stderr);
        for command in ["dead-letters", "pause", "resume", "replay", "console"] {
            assert!(r.stdout.contains(command), "{shell} lacks {command}");
        }
    }
    let mut cmd = outbox(None, None, None);
    cmd.arg("man")
        .env("OUTBOX_DATABASE_URL", "postgres://nobody@127.0.0.1:1/none");
    let r = run(cmd, Duration::from_secs(30)).await;
    assert!(r.status.success(), "{}", r.stderr);
    assert!(r.stdout.contains(".TH outbox 1"));
    assert!(
        r.stdout.contains("dead\\-letters"),
        "the subcommands are listed"
    );
}

/// Output into a pipe that is already closed (`outbox roles print | head -0`): the command ends
/// quietly with 0, not with a panic's report and 101.
#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let mut cmd = outbox(None, None, None);
    cmd.args(["roles", "print"])
        .stdout(writer)
        .stderr(std::process::Stdio::piped());
    let out = cmd.output().expect("the binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !stderr.contains("panicked"),
        "{:?}: {stderr}",
        out.status
    );
}
