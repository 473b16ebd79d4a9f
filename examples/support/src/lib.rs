//! Demo machinery shared by the runnable examples (`examples/fintech`, `examples/igaming`).
//!
//! **This is test and demonstration machinery, not something a service needs.** A service built
//! on the toolkit depends on the facade crate `outbox` and nothing here. What lives here is what
//! the examples' one-command runs need around their story, written once:
//!
//! | module | what |
//! |---|---|
//! | [`child`] | the process side of a child: readiness line, parent watch (exit when stdin closes), logging, `main` |
//! | [`supervise`] | the parent side: start children of `current_exe`, SIGKILL and restart them, the kill schedule, the drain deadline |
//! | [`database`] | connections, a service database's migration and its check, fresh per-run databases and their removal |
//! | [`topology`] | a deployment's broker objects (NATS stream / RabbitMQ exchange and queues) and demo timings, and their removal |
//! | [`relay`] | the toolkit's polling relay as both examples run it (the shape of `outbox relay`) |
//! | [`consumer`] | the settings every consumer of the examples shares (batches; the ordering guard is each one's choice) |
//! | [`run`] | the one-command run's mode (`--short`, `--long`), its overrides, the default services, the run's own databases and broker objects |
//! | [`api`] | HTTP plumbing of an axum API with `Idempotency-Key`: error answers, header and body parsing, stored answers, a command's transaction begun and finished |
//! | [`http_client`] | a small JSON-over-HTTP client for the load drivers and the verification |
//! | [`load`] | what a load sends, concurrent clients at a rate, and the retry-with-the-same-key loop |
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
