//! `gpuctld`: the agent daemon.
fn main() {}
