//! Admission latency benchmark (being written).

fn main() {}
