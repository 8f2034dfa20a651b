//! Slurm's side of a Slurm node (docs/slurm.md): `scontrol` behind [`Scontrol`] (a fake in
//! tests), and the GRES file under the root, written through [`crate::files::write_atomic`].

use crate::apply::EffectError;
use crate::observe::SlurmObserved;
use crate::paths::Root;
use crate::policy::SlurmSettings;
use std::path::Path;
use std::process::Command;

/// Runs `scontrol` with arguments; the output, or the error in its words.
pub trait Scontrol: Send + std::fmt::Debug {
    /// `scontrol ARGS…`: stdout on success, else stderr (or why it could not run).
    fn run(&mut self, args: &[&str]) -> Result<String, String>;
}

/// The `scontrol` of `PATH`. Its own `MessageTimeout` bounds how long a call waits for
/// slurmctld.
#[derive(Debug, Default)]
pub struct ScontrolCommand;

impl Scontrol for ScontrolCommand {
    fn run(&mut self, args: &[&str]) -> Result<String, String> {
        let out = Command::new("scontrol")
            .args(args)
            .output()
            .map_err(|e| format!("scontrol: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            let err = String::from_utf8_lossy(&out.stderr);
            Err(format!("scontrol {}: {}", args.join(" "), err.trim()))
        }
    }
}

/// A Slurm node's settings and its `scontrol`.
#[derive(Debug)]
pub struct SlurmSide {
    /// The policy's `[slurm]`.
    pub settings: SlurmSettings,
    /// How `scontrol` is run.
    pub scontrol: Box<dyn Scontrol>,
}

/// The host's short name: slurmd's default `NodeName` (the kernel's, as `hostname -s`).
pub fn short_hostname() -> Option<String> {
    let h = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    h.trim()
        .split('.')
        .next()
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

fn err(what: &str, message: String) -> EffectError {
    EffectError::Other {
        what: what.to_string(),
        message,
    }
}

impl SlurmSide {
    /// The node's `NodeName`: the policy's `node-name`, else the short host name.
    pub fn node_name(&self) -> Option<String> {
        self.settings.node_name.clone().or_else(short_hostname)
    }

    /// The node's state and the GRES file as it is.
    pub fn observe(&mut self, root: &Root) -> SlurmObserved {
        let node = match self.node_name() {
            None => Err("no node name: set [slurm] node-name".to_string()),
            Some(name) => self
                .scontrol
                .run(&["show", "node", "-o", &name])
                .and_then(|out| {
                    out.lines()
                        .find_map(crate::slurm::parse_node)
                        .ok_or_else(|| format!("scontrol show node {name}: no node in its answer"))
                }),
        };
        let read = |p: &Path| std::fs::read_to_string(root.join(p)).ok();
        SlurmObserved {
            node,
            gres_file: read(&self.settings.gres_file),
            node_file: self.settings.node_file.as_deref().and_then(read),
        }
    }

    /// `scontrol update NodeName=… State=DRAIN Reason=…`.
    pub fn drain(&mut self, node: &str, reason: &str) -> Result<(), EffectError> {
        let (n, r) = (format!("NodeName={node}"), format!("Reason={reason}"));
        self.scontrol
            .run(&["update", &n, "State=DRAIN", &r])
            .map(drop)
            .map_err(|m| err(&format!("drain Slurm node {node}"), m))
    }

    /// `scontrol update NodeName=… State=RESUME`.
    pub fn resume(&mut self, node: &str) -> Result<(), EffectError> {
        let n = format!("NodeName={node}");
        self.scontrol
            .run(&["update", &n, "State=RESUME"])
            .map(drop)
            .map_err(|m| err(&format!("resume Slurm node {node}"), m))
    }

    /// Wait, at most `limit`, until slurmctld answers again after a restart (a `Type=simple`
    /// unit is "started" before it listens): the resume that follows must reach it.
    pub fn wait_controller(&mut self, limit: std::time::Duration) -> Result<(), EffectError> {
        let node = self.node_name().unwrap_or_default();
        let end = std::time::Instant::now() + limit;
        loop {
            match self.scontrol.run(&["show", "node", "-o", &node]) {
                Ok(_) => return Ok(()),
                Err(m) if std::time::Instant::now() >= end => {
                    return Err(err("slurmctld after its restart", m))
                }
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(500)),
            }
        }
    }

    /// `scontrol reconfigure`: slurmctld and the slurmds read their files again.
    pub fn reconfigure(&mut self) -> Result<(), EffectError> {
        self.scontrol
            .run(&["reconfigure"])
            .map(drop)
            .map_err(|m| err("scontrol reconfigure", m))
    }
}

/// Write the GRES file under `root`, atomically (its directory is created if missing).
pub fn write_gres(root: &Root, path: &Path, content: &str) -> Result<(), EffectError> {
    crate::files::write_atomic(&root.join(path), content.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Records every call; answers `show node` with `node`, fails what `fail` names.
    #[derive(Debug, Clone, Default)]
    struct Fake {
        calls: Arc<Mutex<Vec<String>>>,
        node: String,
        fail: Option<String>,
    }

    impl Scontrol for Fake {
        fn run(&mut self, args: &[&str]) -> Result<String, String> {
            let line = args.join(" ");
            self.calls.lock().unwrap().push(line.clone());
            if self.fail.as_deref().is_some_and(|f| line.starts_with(f)) {
                return Err("slurm_load_node error: Unable to contact slurm controller".into());
            }
            Ok(if args[0] == "show" {
                self.node.clone()
            } else {
                String::new()
            })
        }
    }

    fn side(fake: &Fake) -> SlurmSide {
        SlurmSide {
            settings: SlurmSettings {
                enabled: true,
                node_name: Some("n1".into()),
                gres_file: "/etc/slurm/gres.d/gpuctl.conf".into(),
                ..Default::default()
            },
            scontrol: Box::new(fake.clone()),
        }
    }

    #[test]
    fn observe_drain_resume_and_the_file_go_where_they_should() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let fake = Fake {
            node: "NodeName=n1 State=IDLE ThreadsPerCore=1\n".into(),
            ..Default::default()
        };
        let mut s = side(&fake);
        let o = s.observe(&root);
        assert_eq!(o.node.as_ref().unwrap().name, "n1");
        assert_eq!(o.gres_file, None);
        write_gres(&root, &s.settings.gres_file.clone(), "Name=gpu\n").unwrap();
        assert_eq!(s.observe(&root).gres_file.as_deref(), Some("Name=gpu\n"));
        s.drain("n1", "gpuctl: MIG change on GPU 0").unwrap();
        s.resume("n1").unwrap();
        s.reconfigure().unwrap();
        assert_eq!(
            *fake.calls.lock().unwrap(),
            [
                "show node -o n1",
                "show node -o n1",
                // The reason is one argument: no shell in between.
                "update NodeName=n1 State=DRAIN Reason=gpuctl: MIG change on GPU 0",
                "update NodeName=n1 State=RESUME",
                "reconfigure",
            ]
        );
    }

    #[test]
    fn an_unreachable_controller_is_an_unknown_state_not_a_guess() {
        let dir = tempfile::tempdir().unwrap();
        let fake = Fake {
            fail: Some("show".into()),
            ..Default::default()
        };
        let o = side(&fake).observe(&Root::new(dir.path()));
        assert!(o.node.unwrap_err().contains("Unable to contact"));
        let e = side(&fake).drain("n1", "x");
        assert!(e.is_ok(), "only show fails here");
    }
}
