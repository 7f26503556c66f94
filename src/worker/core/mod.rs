//! The worker's pure core: how a message ends (`fate`) and the delays it waits (`backoff`). No I/O,
//! no clocks: the runtime (message, dispatch) passes instants and random numbers in, and the rules
//! of `validate` call these same functions, so a prediction cannot drift from what the worker does.
//! The breaker's state machine (`worker::breaker::Detector`) and the prefetch formulas
//! (`worker::prefetch`, `worker::early_receive`) are pure too and live beside the parts they drive.

pub mod backoff;
pub mod fate;
