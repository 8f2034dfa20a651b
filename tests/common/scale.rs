//! The full-size host of issue #14: 8 H100s in MIG mode, 7 × 1g.10gb each, 32 teams with MPS,
//! 56 MPS daemons (one per MIG device). One definition for `benches/plan_scale.rs` (the plan's
//! speed) and `tests/scale.rs` (that such a host converges, in `cargo test`); VM 65 boots the
//! same shape under systemd.

/// Teams in the policy.
pub const TEAMS: usize = 32;
/// GPUs on the host.
pub const GPUS: usize = 8;
/// MIG devices per GPU (1g.10gb on an H100 80GB).
pub const PER_GPU: usize = 7;

/// The policy: 32 teams with MPS; each MIG device of the 56 goes to one team (teams 0–23 get
/// two devices, teams 24–31 one), so every device gets its own MPS daemon.
pub fn policy_toml() -> String {
    let mut s = String::from("version = 1\n[host]\nreconfigure = \"when-idle\"\n");
    for t in 0..TEAMS {
        s += &format!(
            "[teams.t{t:02}]\nmembers = [\"@grp{t:02}\"]\nmemory-max = \"2G\"\ncpu-weight = 100\n\
             [teams.t{t:02}.mps]\nuser = \"mps-t{t:02}\"\nactive-thread-percentage = 50\n"
        );
    }
    let owners: Vec<usize> = (0..GPUS * PER_GPU)
        .map(|d| if d < 48 { d / 2 } else { 24 + (d - 48) })
        .collect();
    for g in 0..GPUS {
        let mig: Vec<String> = (0..PER_GPU)
            .map(|i| {
                format!(
                    "{{ profile = \"1g.10gb\", owner = \"t{:02}\" }}",
                    owners[g * PER_GPU + i]
                )
            })
            .collect();
        s += &format!("[[gpu]]\nindex = [{g}]\nmig = [ {} ]\n", mig.join(", "));
    }
    s
}
