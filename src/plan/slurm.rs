//! The plan on a Slurm node (`[slurm] enabled`, docs/slurm.md): MIG changes wait until Slurm
//! has drained the node, the GRES file follows the live layout, and the node is resumed after
//! the change, unless someone else drained it. A device out of service drains the node too,
//! until it is back.
//!
//! Slurm hands out devices on its own, so "busy" there is a job, not only a process: a job may
//! hold a MIG device it has not opened yet. A MIG change therefore waits for the node to be
//! drained *and* idle (no job at all, Slurm's own DRAINED state), not only for processes to
//! leave the instances that change.

use super::{push, Action, ActionKind, Blocked, Phase, Plan};
use crate::observe::Observed;
use crate::policy::{Policy, Reconfigure};
use crate::slurm::{self, REASON_PREFIX};
use std::collections::BTreeMap;

fn is_mig(a: &Action) -> bool {
    matches!(a.phase, Phase::MigMode | Phase::MigInstances)
}

/// `plan` as it must run on a Slurm node. Unchanged when Slurm is off or was not observed
/// (a simulated host, `gpuctl plan --simulate`).
pub fn around(policy: &Policy, observed: &Observed, mut plan: Plan) -> Plan {
    if !policy.slurm.enabled {
        return plan;
    }
    let Some(s) = &observed.slurm else {
        return plan;
    };
    // GPUs whose MIG layout the plan changes, by index.
    let changing: BTreeMap<u32, String> = plan
        .actions
        .iter()
        .filter(|a| is_mig(a))
        .filter_map(|a| a.kind.gpu().map(|(u, i)| (i, u.to_string())))
        .collect();
    let gres = slurm::gres(policy, observed);
    let node = match &s.node {
        Ok(n) => n,
        Err(why) => {
            if !changing.is_empty() {
                plan = hold(
                    plan,
                    &changing,
                    &format!("the Slurm node's state is unknown: {why}"),
                );
            }
            return plan;
        }
    };
    // GPUs with a device out of service (docs/health.md): the node stays drained while any is.
    // Slurm 22.05 cannot take one GRES device out of a running node, so the node drains.
    let out = out_of_service_gpus(observed);
    let content = gres.render(&node.name);
    let gres_action = s.gres_file.as_deref() != Some(content.as_str());
    let reason = || {
        let gpus: Vec<String> = changing.keys().map(u32::to_string).collect();
        format!("{REASON_PREFIX} MIG change on GPU {}", gpus.join(","))
    };
    if !changing.is_empty() {
        if node.drain && !node.busy {
            // Drained and idle: the change runs now; the executor writes the GRES file from
            // its second plan, after the new instances exist, and resumes in the last phase.
            if node.drained_by_gpuctl() && out.is_empty() {
                push(
                    &mut plan.actions,
                    Phase::Resume,
                    ActionKind::SlurmResume {
                        node: node.name.clone(),
                    },
                    "the MIG change is done and gpuctl drained the node for it",
                );
            }
        } else {
            let why = if node.drain {
                format!(
                    "waiting for the jobs on Slurm node {} to end (draining)",
                    node.name
                )
            } else {
                format!("Slurm node {} must drain first", node.name)
            };
            let drain = !node.drain;
            plan = hold(plan, &changing, &why);
            if drain {
                push(
                    &mut plan.actions,
                    Phase::Drain,
                    ActionKind::SlurmDrain {
                        node: node.name.clone(),
                        reason: reason(),
                    },
                    "a MIG change needs the node free of jobs; no new job starts meanwhile",
                );
            }
        }
    } else if !plan.blocked.is_empty() && policy.host.reconfigure != Reconfigure::Never {
        // A MIG change held back by running processes: drain, so that no new job lands on
        // the instances while the old ones finish. (Under `never` the wait has no end.)
        if !node.drain {
            let gpus: Vec<String> = plan.blocked.iter().map(|b| b.index.to_string()).collect();
            push(
                &mut plan.actions,
                Phase::Drain,
                ActionKind::SlurmDrain {
                    node: node.name.clone(),
                    reason: format!("{REASON_PREFIX} MIG change on GPU {}", gpus.join(",")),
                },
                "a MIG change waits for running jobs; no new job starts meanwhile",
            );
        }
    } else if node.drained_by_gpuctl() && out.is_empty() {
        push(
            &mut plan.actions,
            Phase::Resume,
            ActionKind::SlurmResume {
                node: node.name.clone(),
            },
            "no MIG change left: resume the node gpuctl drained",
        );
    }
    let draining = plan
        .actions
        .iter()
        .any(|a| matches!(a.kind, ActionKind::SlurmDrain { .. }));
    if !out.is_empty() && !node.drain && !draining {
        let gpus: Vec<String> = out.iter().map(u32::to_string).collect();
        push(
            &mut plan.actions,
            Phase::Drain,
            ActionKind::SlurmDrain {
                node: node.name.clone(),
                reason: format!("{REASON_PREFIX} GPU {} out of service", gpus.join(",")),
            },
            "a device is out of service: no new Slurm job may land on it",
        );
    }
    let node_content = gres.render_node();
    let node_action = policy
        .slurm
        .node_file
        .as_ref()
        .filter(|_| s.node_file.as_deref() != Some(node_content.as_str()));
    if let Some(path) = node_action {
        push(
            &mut plan.actions,
            Phase::Devices,
            ActionKind::WriteGres {
                path: path.clone(),
                content: node_content,
            },
            "the node's Gres= differs from the live GPU layout",
        );
    }
    if gres_action || node_action.is_some() {
        if gres_action {
            push(
                &mut plan.actions,
                Phase::Devices,
                ActionKind::WriteGres {
                    path: policy.slurm.gres_file.clone(),
                    content,
                },
                "the GRES file differs from the live GPU layout",
            );
        }
        push(
            &mut plan.actions,
            Phase::Devices,
            ActionKind::SlurmReload {
                restart: policy.slurm.restart.clone(),
            },
            "Slurm reads GRES types only when it starts",
        );
    }
    plan.actions.sort_by_key(|a| a.phase);
    plan
}

/// The GPUs, by index, with the whole GPU or one of its MIG devices out of service.
fn out_of_service_gpus(observed: &Observed) -> Vec<u32> {
    let out = &observed.out_of_service;
    observed
        .gpus
        .iter()
        .filter(|g| {
            out.contains(&g.uuid)
                || g.mig
                    .iter()
                    .flat_map(|m| &m.instances)
                    .any(|gi| gi.compute.iter().any(|ci| out.contains(&ci.uuid)))
        })
        .map(|g| g.index)
        .collect()
}

/// The plan while the node drains: nothing changes yet (every later action was computed
/// against the new layout), and each GPU that would change says why it waits.
fn hold(plan: Plan, changing: &BTreeMap<u32, String>, why: &str) -> Plan {
    let mut blocked = plan.blocked;
    for (index, gpu) in changing {
        blocked.push(Blocked {
            index: *index,
            gpu: gpu.clone(),
            gi: None,
            holders: vec![],
            reason: format!("MIG change on gpu {index}: {why}"),
        });
    }
    Plan {
        actions: vec![],
        blocked,
        replan_after_mig: false,
    }
}
