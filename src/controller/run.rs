//! `qc-operator run`: the controllers, metrics and health endpoints, and leader election.
//! Wiring only: each reconcile is `super::reconcile`.
