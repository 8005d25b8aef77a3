//! Benchmarks of the pure core. Filled in with the recovery machine.
fn main() {}
