//! `qc-operator import`: other tools' objects turned into QueueConsumers, with a note for every field
//! that does not carry over. Pure: text in, YAML and notes out (the binary reads the files).

pub mod keda;
pub mod yaml;
