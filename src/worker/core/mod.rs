//! The worker's pure core: how a message ends (`fate`), the delays it waits (`backoff`), what to
//! receive and when (`plan`), and the outage breaker's state machine (`breaker`). No I/O, no clocks:
//! the runtime (message, dispatch, `worker::breaker::Breaker`) passes instants, measurements and
//! random numbers in and carries the answers out, and the rules of `validate` call these same
//! functions, so a prediction cannot drift from what the worker does.

pub mod backoff;
pub mod breaker;
pub mod fate;
pub mod filter;
pub mod plan;
pub mod schema;
