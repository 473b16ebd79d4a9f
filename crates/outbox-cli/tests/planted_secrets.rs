//! No secret in any output: every `outbox` command runs at `RUST_LOG=trace` with credentials
//! planted in every form (user:password, a NATS token, a `?password=` query parameter, a
//! percent-encoded password, flags, environment variables, the `--config` file), against the
//! real services (which ignore the planted credentials: PostgreSQL trusts, NATS has no auth)
//! and against unreachable addresses (the error paths). The test fails if any planted secret,
//! as written or percent-decoded, appears in stdout or stderr.
#![allow(missing_docs)]

mod common;

use std::process::Command;
use std::time::Duration;

use common::{ChildGuard, TempFile, TestDb, outbox, run, uid};

/// How one run passes its URLs.
#[derive(Debug, Clone, Copy)]
enum Form {
    /// `--database-url` / `--broker-url` flags: user:password plus `?password=` and a
    /// percent-encoded password on PostgreSQL, a token on NATS.
    Flags,
    /// `DATABASE_URL` and `OUTBOX_BROKER_URL`: user:password on both.
    Env,
    /// The `--config` file: user:password on PostgreSQL, the real RabbitMQ with a wrong
    /// password (the AMQP handshake runs at trace level and is refused).
    File,
}

struct Planted {
    secrets: Vec<String>,
    schema: String,
    config: TempFile,
    flag_db: String,
    flag_broker: String,
    env_db: String,
    env_broker: String,
}

impl Planted {
    fn new(schema: &str) -> Planted {
        let id = uid();
        let s = |n: &str| format!("pl4nted{n}x{id}");
        let secrets: Vec<String> = [
            "flagpw", "flagq", "flagtok", "envpw", "envnats", "filepw", "fileamqp", "provq",
        ]
        .iter()
        .map(|n| s(n))
        .collect();
        let enc = format!("pl4nted%40enc{id}");
        let flag_db = format!(
            "postgres://postgres:{}@127.0.0.1:5432/test?password={}&application_name=planted",
            secrets[0], secrets[1]
        );
        let flag_broker = format!("nats://{}@127.0.0.1:4222", secrets[2]);
        let env_db = format!(
            "postgres://postgres:{enc}{}@127.0.0.1:5432/test",
            secrets[3]
        );
        let env_broker = format!("nats://relay:{}@127.0.0.1:4222", secrets[4]);
        let config = TempFile::new(
            ".toml",
            &format!(
                "database_url = \"postgres://postgres:{}@127.0.0.1:5432/test\"\n\
                 broker_url = \"amqp://guest:{}@127.0.0.1:5672/%2f\"\n",
                secrets[5], secrets[6]
            ),
        );
        let mut all = secrets;
        all.push(enc.clone());
        all.push(enc.replace("%40", "@"));
        Planted {
            secrets: all,
            schema: schema.to_owned(),
            config,
            flag_db,
            flag_broker,
            env_db,
            env_broker,
        }
    }

    fn provider_secret(&self) -> &str {
        &self.secrets[7]
    }

    /// `outbox ARGS` with the URLs passed in `form`, at trace level.
    fn command(&self, form: Form, args: &[&str]) -> Command {
        let mut cmd = outbox(Some(&self.schema), None, None);
        cmd.env_remove("OUTBOX_DATABASE_URL")
            .env("RUST_LOG", "trace")
            .env("NO_COLOR", "1");
        match form {
            Form::Flags => {
                cmd.args([
                    "--database-url",
                    &self.flag_db,
                    "--broker-url",
                    &self.flag_broker,
                ]);
            }
            Form::Env => {
                cmd.env("DATABASE_URL", &self.env_db)
                    .env("OUTBOX_BROKER_URL", &self.env_broker);
            }
            Form::File => {
                cmd.env("OUTBOX_CONFIG", self.config.path());
            }
        }
        cmd.args(args);
        cmd
    }

    /// Panics when any planted secret is in `output`.
    fn assert_clean(&self, what: &str, output: &str) {
        for s in &self.secrets {
            assert!(
                !output.contains(s.as_str()),
                "{what}: the planted secret `{s}` appears in the output:\n{}",
                output
                    .lines()
                    .filter(|l| l.contains(s.as_str()))
                    .take(5)
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
    }
}

/// Held while a command that uses fixed names (the demo's schema, the matrix's prefix) runs.
static FIXED_NAMES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Commands that finish by themselves (or fail at once).
fn short_commands(provider_secret: &str) -> Vec<Vec<String>> {
    let v = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<String>>();
    #[allow(unused_mut)]
    let mut commands = vec![
        v(&["migrate"]),
        v(&["status"]),
        v(&["status", "--json", "--relay-metrics", "127.0.0.1:1"]),
        v(&["dead-letters", "list"]),
        v(&["dead-letters", "requeue", "--all"]),
        v(&["conflicts", "list"]),
        v(&["consumer-dead-letters", "list"]),
        v(&["consumer-dead-letters", "requeue", "--all"]),
        v(&[
            "cleanup",
            "--inbox-keep-secs",
            "100",
            "--broker-retention-secs",
            "10",
        ]),
        v(&["effects", "status"]),
        v(&["effects", "list"]),
        v(&["effects", "resolve", "999999", "--failed", "planted"]),
        vec![
            "effects".into(),
            "run".into(),
            "--provider-url".into(),
            format!("http://127.0.0.1:1/?token={provider_secret}"),
        ],
        v(&["roles", "print"]),
        v(&["roles", "print", "--bootstrap"]),
        v(&["roles", "apply"]),
        v(&["roles", "check", "--component", "relay"]),
        v(&["roles", "check", "--component", "migrator"]),
    ];
    // The test tools exist only in a build with the `harness` feature (CI builds it).
    #[cfg(feature = "harness")]
    commands.extend([
        v(&["demo-producer", "--payments", "3"]),
        v(&["demo", "--payments", "3", "--clients", "1"]),
        v(&["crash-matrix", "--cells", "c1", "--payments", "3"]),
    ]);
    commands
}

/// Commands that run until stopped: started, given a few seconds to connect (or fail), then
/// stopped.
fn long_commands() -> Vec<Vec<&'static str>> {
    #[allow(unused_mut)]
    let mut commands = vec![
        vec!["relay"],
        vec![
            "cleanup",
            "--inbox-keep-secs",
            "100",
            "--broker-retention-secs",
            "10",
            "--loop",
        ],
        vec!["effects", "run", "--provider-url", "http://127.0.0.1:1"],
    ];
    #[cfg(feature = "harness")]
    commands.extend([
        vec!["demo-consumer"],
        vec!["demo-provider", "--listen", "127.0.0.1:0"],
    ]);
    commands
}

async fn run_form(p: &Planted, form: Form) -> (usize, usize) {
    let mut traced = 0;
    let mut runs = 0;
    for args in short_commands(p.provider_secret()) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        // `demo` and `crash-matrix` drop and recreate fixed schemas and streams of their own:
        // the three forms take turns with them instead of wiping each other's.
        let _turn = match args[0] {
            "demo" | "crash-matrix" => Some(FIXED_NAMES.lock().await),
            _ => None,
        };
        let r = run(p.command(form, &args), Duration::from_secs(120)).await;
        let what = format!("{form:?} outbox {}", args.join(" "));
        let output = format!("{}{}", r.stdout, r.stderr);
        assert!(!output.is_empty(), "{what}: no output at all");
        p.assert_clean(&what, &output);
        traced += usize::from(r.stderr.contains("TRACE") || r.stderr.contains("DEBUG"));
        runs += 1;
        if matches!(args[0], "migrate" | "status") && args.len() == 1 && !matches!(form, Form::File)
        {
            assert!(
                r.status.success(),
                "{what}: the reachable path must work: {r:?}"
            );
        }
    }
    for args in long_commands() {
        let what = format!("{form:?} outbox {}", args.join(" "));
        let mut child = ChildGuard::spawn(p.command(form, &args), "planted");
        tokio::time::sleep(Duration::from_secs(3)).await;
        child.terminate().await;
        let output = child.log();
        assert!(!output.is_empty(), "{what}: no output at all");
        p.assert_clean(&what, &output);
        traced += usize::from(output.contains("TRACE") || output.contains("DEBUG"));
        runs += 1;
    }
    (traced, runs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_command_prints_a_planted_secret_at_trace_level() {
    let db = TestDb::new().await;
    let p = Planted::new(db.name());
    let (a, b, c) = tokio::join!(
        run_form(&p, Form::Flags),
        run_form(&p, Form::Env),
        run_form(&p, Form::File)
    );
    let traced = a.0 + b.0 + c.0;
    let runs = a.1 + b.1 + c.1;
    assert_eq!(runs, 3 * (short_commands("").len() + long_commands().len()));
    // The logs were really at debug/trace level for the commands that connect.
    assert!(
        traced * 2 > runs,
        "only {traced} of {runs} runs logged at debug/trace level"
    );
    db.drop().await;
}
