//! Demo machinery shared by the runnable examples (`examples/fintech`, `examples/igaming`).
//!
//! **This is test and demonstration machinery, not something a service needs.** A service built
//! on the toolkit depends on the facade crate `outbox` and nothing here. What lives here is what
//! the examples' one-command runs need around their story, written once:
//!
//! | module | what |
//! |---|---|
//! | [`child`] | the process side of a child: readiness line, parent watch (exit when stdin closes), logging, `main` |
//! | [`supervise`] | the parent side: start children of `current_exe`, SIGKILL and restart them, the kill schedule, the drain deadline, the frame of a run's story |
//! | [`watch`] | the watch over a run's load: children checked, kills on schedule with their restarts, progress lines, the drain |
//! | [`database`] | connections, a service's database (its tables, its migration and the check of it), fresh per-run databases and their removal |
//! | [`topology`] | a deployment's broker objects (NATS stream / RabbitMQ exchange and queues) and demo timings, and their removal |
//! | [`relay`] | the toolkit's polling relay as both examples run it (the shape of `outbox relay`) |
//! | [`consumer`] | a consumer's subscription and its construction on the library's API, the settings every consumer shares, the decoding of a payload |
//! | [`run`] | the one-command run's mode (`--short`, `--long`), its overrides, the default services, the run's own databases and broker objects |
//! | [`api`] | HTTP plumbing of an axum API with `Idempotency-Key`: error answers, a command's key and body, stored answers, a command's transaction begun and finished |
//! | [`http_client`] | a small JSON-over-HTTP client for the load drivers and the verification |
//! | [`load`] | what a load sends, concurrent clients at a rate, the retry-with-the-same-key loop, the API's request idempotency checked from outside |
//! | [`table`] | the `VERIFICATION` table: checks, printing, the exit status, and parsing it back in tests |
//!
//! The stories themselves (APIs, handlers, schemas, the checks) stay in each example.
#![forbid(unsafe_code)]

pub mod api;
pub mod child;
pub mod consumer;
pub mod database;
pub mod http_client;
pub mod load;
pub mod relay;
pub mod run;
pub mod supervise;
pub mod table;
pub mod topology;
pub mod watch;
