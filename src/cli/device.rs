//! `gpuctl device list|drain|resume`: device health (`Health`, `DeviceDrain`, `DeviceResume`
//! on the bus; docs/health.md).

use super::shell::{parse_reply, with_agent, Failure};
use crate::dbus_api::reply::{DeviceChangeReply, DeviceHealthStatus, HealthReply};
use clap::{Args, Subcommand};

/// Arguments of `gpuctl device`.
#[derive(Debug, Args)]
#[command(
    after_long_help = "A device is a GPU index, a GPU-… UUID or a MIG-… UUID. A device out of \
service takes no new job (placement skips it, new joins do not see it); jobs already on it keep \
running unless [host.health] on-fault = \"stop\". gpuctld takes a device out on a fatal XID, a \
double-bit or new uncorrectable ECC error, a failed or pending row remap, or a lost GPU; an \
admin drains one for maintenance. Resume is refused while the GPU still shows a condition only \
a reset clears (a pending row remap, a lost GPU).

Exit status: 0; 1 the change was refused; 6 gpuctld not running; 2 other failure."
)]
pub struct DeviceArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: DeviceAction,
}

/// `gpuctl device` subcommands.
#[derive(Debug, Subcommand)]
pub enum DeviceAction {
    /// Every device: in or out of service, why and since when, XIDs seen.
    List {
        /// Print the daemon's JSON document.
        #[arg(long)]
        json: bool,
    },
    /// Take a device out of service (root).
    Drain {
        /// GPU index, GPU-… or MIG-… UUID.
        device: String,
        /// Why (kept in the journal and shown by status).
        #[arg(long)]
        reason: String,
    },
    /// Bring a device back into service (root).
    Resume {
        /// GPU index, GPU-… or MIG-… UUID.
        device: String,
        /// Why.
        #[arg(long)]
        reason: String,
    },
}

/// A unix time as UTC `YYYY-MM-DD HH:MM`: the leases' civil date ([`crate::placement::utc`])
/// to the minute.
pub fn when(t: u64) -> String {
    crate::placement::utc(t)[..16].replace('T', " ")
}

/// One line per device's state: `in service`, or `OUT since … by …: reason`.
pub fn state(d: &DeviceHealthStatus) -> String {
    if d.in_service {
        return "in service".into();
    }
    let mut s = format!(
        "OUT since {} by {}: {}",
        d.since.map_or_else(|| "?".into(), when),
        d.by.as_deref().unwrap_or("?"),
        d.reason.as_deref().unwrap_or("?")
    );
    if d.reset_when_idle {
        s.push_str(" (reset when idle)");
    }
    s
}

/// The human view of a `Health` reply.
pub fn render(r: &HealthReply) -> String {
    let mut o = String::new();
    if !r.watching {
        o.push_str(&format!(
            "health watcher: not reading NVML{}\n",
            r.watcher_error
                .as_deref()
                .map(|e| format!(" ({e})"))
                .unwrap_or_default()
        ));
    }
    o.push_str(&format!(
        "{:<4} {:<44} {:<10} {}\n",
        "GPU", "DEVICE", "XIDS", "STATE"
    ));
    for d in &r.devices {
        let xids = d
            .xids
            .iter()
            .map(|(c, n)| format!("{c}×{n}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut st = state(d);
        for c in &d.conditions {
            if d.reason.as_deref() != Some(c.describe()) {
                st.push_str(&format!("; {}", c.describe()));
            }
        }
        if d.slowdown {
            st.push_str("; hardware slowdown");
        }
        let dev = if d.mig {
            format!("  {}", d.uuid)
        } else {
            d.uuid.clone()
        };
        o.push_str(&format!(
            "{:<4} {:<44} {:<10} {st}\n",
            d.gpu_index,
            dev,
            if xids.is_empty() { "-".into() } else { xids }
        ));
    }
    o
}

/// gpuctld's `Health` reply.
pub fn fetch() -> Result<HealthReply, Failure> {
    with_agent("Health", async |p| p.health().await).and_then(|t| parse_reply("Health", &t))
}

/// Run `gpuctl device`.
pub fn run(args: &DeviceArgs) -> i32 {
    match &args.action {
        DeviceAction::List { json } => match fetch() {
            Ok(r) if *json => {
                println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
                super::exit::OK
            }
            Ok(r) => {
                print!("{}", render(&r));
                super::exit::OK
            }
            Err(f) => f.report(),
        },
        DeviceAction::Drain { device, reason } | DeviceAction::Resume { device, reason } => {
            let resume = matches!(args.action, DeviceAction::Resume { .. });
            let what = if resume {
                "DeviceResume"
            } else {
                "DeviceDrain"
            };
            let got = with_agent(what, async |p| {
                if resume {
                    p.device_resume(device, reason).await
                } else {
                    p.device_drain(device, reason).await
                }
            })
            .and_then(|t| parse_reply::<DeviceChangeReply>(what, &t));
            match got {
                Ok(r) => {
                    println!(
                        "{}: {} ({} by {})",
                        r.device,
                        if r.in_service {
                            "back in service"
                        } else {
                            "out of service"
                        },
                        r.reason,
                        r.by
                    );
                    super::exit::OK
                }
                Err(f) => f.report(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_states_read_plainly() {
        assert_eq!(when(1_764_756_000), "2025-12-03 10:00");
        let d = DeviceHealthStatus {
            uuid: "GPU-1".into(),
            in_service: false,
            reason: Some("XID 79 (GPU has fallen off the bus)".into()),
            since: Some(1_764_756_000),
            by: Some("gpuctld".into()),
            ..Default::default()
        };
        assert_eq!(
            state(&d),
            "OUT since 2025-12-03 10:00 by gpuctld: XID 79 (GPU has fallen off the bus)"
        );
    }
}
