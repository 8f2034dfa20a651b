//! Why a reconcile runs: one value per source instead of free text, so the loop can tell a retry
//! from a hand change and the journal line stays the same wording everywhere.

use std::fmt;

/// What asked for a reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    /// gpuctld started.
    Start,
    /// `systemctl reload gpuctld` (SIGHUP).
    Sighup,
    /// The periodic full check.
    DriftTimer,
    /// A policy drop-in was written, renamed or removed.
    PolicyFiles,
    /// A bus method (`Apply`, `Reload`).
    Bus(&'static str),
    /// systemd removed a unit the policy wants.
    UnitRemoved(String),
    /// Control drop-ins of owned units changed; `during_reconcile` when gpuctld was writing
    /// them itself (one more, normally empty, check).
    Dropins {
        /// The files, sorted.
        files: Vec<String>,
        /// gpuctld was reconciling when they changed.
        during_reconcile: bool,
    },
    /// An MPS daemon the policy wants went inactive or failed.
    MpsState {
        /// The unit.
        unit: String,
        /// Its `ActiveState`.
        state: String,
    },
    /// A device major was registered or removed (a module loaded, a driver reloaded).
    Majors,
    /// A run failed with errors that may not recur: attempt `attempt` since the last success.
    Retry {
        /// 1 for the first retry.
        attempt: u32,
    },
    /// A change waits for holders to go; nothing else says when they do.
    Recheck,
    /// A device went out of service or came back: the team env files follow.
    Health,
    /// gpuctld switched these GPUs to other allowed layouts.
    Reslice(Vec<u32>),
}

impl fmt::Display for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Trigger::Start => f.write_str("start"),
            Trigger::Sighup => f.write_str("SIGHUP"),
            Trigger::DriftTimer => f.write_str("drift timer"),
            Trigger::PolicyFiles => f.write_str("policy files changed"),
            Trigger::Bus(method) => write!(f, "D-Bus {method}"),
            Trigger::UnitRemoved(unit) => write!(f, "{unit} removed"),
            Trigger::Dropins {
                files,
                during_reconcile,
            } => {
                let what = if *during_reconcile {
                    "re-check after control drop-ins changed during a reconcile"
                } else {
                    "drift: control drop-ins changed"
                };
                write!(f, "{what}: {}", files.join(" "))
            }
            Trigger::MpsState { unit, state } => write!(f, "drift: {unit} is {state}"),
            Trigger::Majors => f.write_str("the registered device majors changed"),
            Trigger::Retry { attempt } => write!(f, "retry {attempt} after transient errors"),
            Trigger::Recheck => f.write_str("re-check of changes waiting for holders"),
            Trigger::Health => f.write_str("a device went out of service or came back"),
            Trigger::Reslice(gpus) => write!(
                f,
                "re-slice of GPU {}",
                gpus.iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}
