//! gpuctl's real NVML path (nvml-wrapper → dlopen → libfake_nvml.so) end to end: observe,
//! plan, transactional apply, journal recovery.
//!
//! The fake embeds the same `data/gpu-profiles.json` as gpuctl: what a geometry here fits or not
//! is gpuctl agreeing with that file, not with a driver. tests/profiles_reference.rs checks a
//! few of its values against hand-written numbers from NVIDIA's MIG User Guide.

mod fakehost;

use fakehost::{layout, mig_part, policy, FakeHost};
use gpuctl::apply::{EffectError, Observer};
use gpuctl::plan::{self, desired};
use gpuctl::policy::validate::check_against_host;
use gpuctl::policy::Severity;
use gpuctl::profiles::Catalog;

fn teams(names: &[&str]) -> String {
    names
        .iter()
        .map(|t| format!("[teams.{t}]\nmembers = [\"@{t}\"]\n"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// 7 × 1g.10gb on one H100, owners a..g, with team `g`'s instance replaced by `last`.
fn seven(last: &str) -> String {
    format!(
        "version = 1\n[host]\nreconfigure = \"when-idle\"\n{}\n[[gpu]]\nindex = [0]\nmig = [\n\
         {{ profile = \"1g.10gb\", owner = \"a\" }}, {{ profile = \"1g.10gb\", owner = \"b\" }},\n\
         {{ profile = \"1g.10gb\", owner = \"c\" }}, {{ profile = \"1g.10gb\", owner = \"d\" }},\n\
         {{ profile = \"1g.10gb\", owner = \"e\" }}, {{ profile = \"1g.10gb\", owner = \"f\" }},\n\
         {{ profile = \"{last}\", owner = \"g\" }},\n]\n",
        teams(&["a", "b", "c", "d", "e", "f", "g"])
    )
}

#[test]
fn every_example_geometry_applies_on_every_model_that_holds_it() {
    let dir = std::env::current_dir().unwrap().join("policies");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    assert!(files.len() >= 4);
    let mut applied_mig = 0;
    let mut applied_on = std::collections::BTreeMap::new();
    for f in &files {
        let p = gpuctl::policy::load_files(std::slice::from_ref(f))
            .policy
            .unwrap_or_else(|| panic!("{} loads", f.display()));
        for m in Catalog::get().models() {
            let spec = format!("{}*8", m.sim_name());
            let fake = FakeHost::new(&spec);
            let obs = fake.observe();
            assert_eq!(obs.gpus.len(), 8, "{spec}");
            let errors = check_against_host(&p, &obs)
                .into_iter()
                .filter(|d| d.severity == Severity::Error)
                .count();
            if errors > 0 {
                // Not this model's geometry. That a rejected policy touches nothing is
                // tested through the binary, which runs this check before applying
                // (tests/nvml_cli.rs, invalid_geometries_are_rejected_before_any_nvml_mutation).
                continue;
            }
            applied_on
                .entry(f.clone())
                .or_insert_with(Vec::new)
                .push(spec.clone());
            let d = desired(&p, &obs);
            let r = fake.apply(&p);
            assert!(
                r.failed.is_empty(),
                "{} on {spec}: {:?}",
                f.display(),
                r.failed
            );
            let after = fake.observe();
            assert!(
                mig_part(&plan::plan(&p, &after)).is_empty(),
                "{} on {spec}: re-plan not empty: {:?}",
                f.display(),
                mig_part(&plan::plan(&p, &after))
            );
            for gd in &d.gpus {
                let mut want: fakehost::Layout = gd
                    .mig
                    .layout
                    .iter()
                    .map(|l| {
                        let mut cis: Vec<_> = l
                            .cis
                            .iter()
                            .map(|c| (c.profile.clone(), c.placement.start, c.placement.size))
                            .collect();
                        cis.sort();
                        (
                            l.profile.clone(),
                            l.placement.start,
                            l.placement.size,
                            l.owner.clone(),
                            cis,
                        )
                    })
                    .collect();
                want.sort_by_key(|x| (x.1, x.2));
                assert_eq!(
                    layout(&after, gd.index),
                    want,
                    "{} on {spec} gpu {}",
                    f.display(),
                    gd.index
                );
                if !want.is_empty() {
                    applied_mig += 1;
                    // Every MIG device has its UUID and the cap minors are known.
                    let g = after.gpu(gd.index).unwrap();
                    for gi in &g.mig.as_ref().unwrap().instances {
                        for c in &gi.compute {
                            assert!(c.uuid.starts_with("MIG-"), "{:?}", c);
                        }
                    }
                }
            }
            assert!(
                !after.mig_minors.is_empty(),
                "mig-minors read under the root"
            );
            assert!(
                !fake.journal_path().exists(),
                "journal removed after success"
            );
        }
    }
    assert!(applied_mig >= 4, "only {applied_mig} MIG GPUs applied");
    // No example is skipped on every model: each one was applied and checked somewhere.
    let skipped: Vec<_> = files
        .iter()
        .filter(|f| !applied_on.contains_key(*f))
        .collect();
    assert!(skipped.is_empty(), "rejected on every model: {skipped:?}");
}

#[test]
fn changing_one_of_seven_costs_one_destroy_and_one_create_and_spares_busy_ones() {
    let fake = FakeHost::new("h100");
    let p1 = policy(fake.dir.path(), "p1.toml", &seven("1g.10gb"));
    let r = fake.apply(&p1);
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    let obs = fake.observe();
    let gis = &obs.gpus[0].mig.as_ref().unwrap().instances;
    assert_eq!(gis.len(), 7);
    // Teams a..f run jobs; g's instance is idle.
    let mut busy = Vec::new();
    for (n, gi) in gis.iter().enumerate() {
        if gi.owner.as_deref() != Some("g") {
            fake.add_process(0, gi.id, gi.compute[0].id, 1000 + n as u32, "job.service");
            busy.push(gi.id);
        }
    }
    assert_eq!(busy.len(), 6);
    let seen = fake.observe();
    let held = &seen.gpus[0].mig.as_ref().unwrap().instances;
    assert!(held
        .iter()
        .filter(|g| busy.contains(&g.id))
        .all(|g| g.compute[0].processes[0].unit.as_deref() == Some("job.service")));

    let before = fake.log().len();
    let p2 = policy(fake.dir.path(), "p2.toml", &seven("1g.10gb+me"));
    let r = fake.apply(&p2);
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    let log = fake.log();
    let new = &log[before..];
    let count = |f: &str| new.iter().filter(|(n, _, _)| n == f).count();
    assert_eq!(count("nvmlGpuInstanceDestroy"), 1, "{new:?}");
    assert_eq!(
        count("nvmlDeviceCreateGpuInstanceWithPlacement") + count("nvmlDeviceCreateGpuInstance"),
        1
    );
    for (f, res, args) in new {
        if f == "nvmlGpuInstanceDestroy" {
            let id = args["gpuInstanceId"].as_u64().unwrap() as u32;
            assert!(!busy.contains(&id), "destroyed busy gi{id}");
            assert_eq!(res, "NVML_SUCCESS");
        }
    }
    let after = fake.observe();
    assert!(mig_part(&plan::plan(&p2, &after)).is_empty());
    let l = layout(&after, 0);
    assert!(l
        .iter()
        .any(|x| x.0 == "1g.10gb+me" && x.3.as_deref() == Some("g")));
}

#[test]
fn when_idle_reports_blocking_pids_with_their_units_and_cgroups() {
    let fake = FakeHost::new("h100");
    let p1 = policy(fake.dir.path(), "p1.toml", &seven("1g.10gb"));
    fake.apply(&p1);
    let obs = fake.observe();
    let gis = obs.gpus[0].mig.as_ref().unwrap().instances.clone();
    for gi in &gis {
        fake.add_process(0, gi.id, gi.compute[0].id, 2000 + gi.id, "train.service");
    }
    // One PID sits in a user session without a service: its cgroup names it.
    let p = fake.root.join(format!("proc/{}/cgroup", 2000 + gis[0].id));
    std::fs::write(&p, "0::/user.slice/user-1000.slice/session-7.scope/x\n").unwrap();
    let calls = fake.mutating_calls();
    let p2 = policy(fake.dir.path(), "p2.toml", &seven("1g.10gb+me"));
    let r = fake.apply(&p2);
    assert_eq!(fake.mutating_calls(), calls, "nothing touched while busy");
    assert!(r.failed.is_empty());
    let blocked = &r.remaining.blocked;
    assert!(!blocked.is_empty());
    let all: Vec<&String> = blocked.iter().flat_map(|b| &b.holders).collect();
    assert!(
        all.iter().any(|h| h.contains("train.service")),
        "{blocked:?}"
    );
}

/// Initial 4g(busy)+3g; target 4g(kept) + 1g ×3: the 3g goes, three 1g are created.
const FAULT_START: &str = "version = 1\n[teams.a]\nmembers=[\"@a\"]\n[teams.b]\nmembers=[\"@b\"]\n\
[[gpu]]\nindex = [0]\nmig = [ { profile = \"4g.40gb\", owner = \"a\" }, \
{ profile = \"3g.40gb\", owner = \"b\", compute = [\"1c\", \"2c\"] } ]\n";
const FAULT_TARGET: &str =
    "version = 1\n[teams.a]\nmembers=[\"@a\"]\n[teams.b]\nmembers=[\"@b\"]\n\
[[gpu]]\nindex = [0]\nmig = [ { profile = \"4g.40gb\", owner = \"a\" }, \
{ profile = \"1g.10gb\", owner = \"b\" }, { profile = \"2g.20gb\", owner = \"b\" } ]\n\
[[gpu]]\nindex = [1]\nmig = [ { profile = \"3g.40gb\", owner = \"a\" } ]\n";

fn fault_setup(fake: &FakeHost) -> (gpuctl::policy::Policy, u32) {
    let p0 = policy(fake.dir.path(), "p0.toml", FAULT_START);
    let r = fake.apply(&p0);
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    let obs = fake.observe();
    let busy = obs.gpus[0]
        .mig
        .as_ref()
        .unwrap()
        .instances
        .iter()
        .find(|g| g.profile == "4g.40gb")
        .unwrap()
        .clone();
    fake.add_process(0, busy.id, busy.compute[0].id, 4242, "serve.service");
    (policy(fake.dir.path(), "p1.toml", FAULT_TARGET), busy.id)
}

fn assert_safe(fake: &FakeHost, busy: u32) {
    for (f, res, args) in fake.log() {
        assert_ne!(
            res, "NVML_ERROR_IN_USE",
            "gpuctl tried a busy instance: {f} {args}"
        );
        if f == "nvmlGpuInstanceDestroy" && args["gpu"] == 0 {
            assert_ne!(args["gpuInstanceId"].as_u64(), Some(u64::from(busy)));
        }
    }
}

#[test]
fn fault_at_every_mutating_call_then_next_apply_converges() {
    // The clean run tells how many mutating calls the change takes.
    let n = {
        let fake = FakeHost::new("h100*2");
        let (p1, busy) = fault_setup(&fake);
        let c0 = fake.mutating_calls();
        let r = fake.apply(&p1);
        assert!(r.failed.is_empty(), "{:?}", r.failed);
        assert_safe(&fake, busy);
        fake.mutating_calls() - c0
    };
    assert!(n >= 8, "the change takes {n} calls");
    let mut restored_somewhere = false;
    for k in 1..=n {
        let fake = FakeHost::new("h100*2");
        let (p1, busy) = fault_setup(&fake);
        fake_nvml::control::fail_nth_mutating_call(&fake.state, k, 999).unwrap();
        let r = fake.apply(&p1);
        assert!(!r.failed.is_empty(), "k={k}: the fault did not hit");
        restored_somewhere |= !r.restored.is_empty();
        // Never empty: GPU 0 keeps at least its busy instance, and GPU 1 either has its
        // instance or never had one.
        let mid = fake.observe();
        assert!(!layout(&mid, 0).is_empty(), "k={k}");
        assert_safe(&fake, busy);
        assert!(
            fake.journal_path().exists(),
            "k={k}: journal kept after a failure"
        );
        fake_nvml::control::clear_faults(&fake.state).unwrap();
        let r = fake.apply(&p1);
        assert!(r.failed.is_empty(), "k={k}: {:?}", r.failed);
        let after = fake.observe();
        assert!(
            mig_part(&plan::plan(&p1, &after)).is_empty(),
            "k={k}: {:?}",
            mig_part(&plan::plan(&p1, &after))
        );
        assert_safe(&fake, busy);
        assert!(!fake.journal_path().exists(), "k={k}: journal closed");
    }
    // A create failing after the 3g was destroyed puts the 3g back rather than leave the
    // slices empty.
    assert!(restored_somewhere);
}

/// A host that dies (panics, as a killed process would stop) at its k-th mutating call.
struct Crashing {
    inner: gpuctl::real::RealHost,
    left: u32,
}

impl Crashing {
    fn tick(&mut self) {
        self.left -= 1;
        if self.left == 0 {
            panic!("simulated crash");
        }
    }
}

mod delegate {
    use super::Crashing;
    use gpuctl::apply::*;
    use gpuctl::observe::{MpsSpec, Observed, SliceSpec};
    use gpuctl::policy::TeamName;
    use gpuctl::profiles::Placement;
    use std::time::Duration;

    impl Observer for Crashing {
        fn observe(&mut self) -> Result<Observed, EffectError> {
            self.inner.observe()
        }
        fn refresh(
            &mut self,
            prev: &Observed,
            gpus: &std::collections::BTreeSet<String>,
        ) -> Result<Observed, EffectError> {
            self.inner.refresh(prev, gpus)
        }
        fn refresh_processes(&mut self, obs: &mut Observed, gpu: &str) -> Result<(), EffectError> {
            self.inner.refresh_processes(obs, gpu)
        }
    }
    impl GpuEffector for Crashing {
        fn set_mig_mode(&mut self, g: &str, e: bool) -> Result<bool, EffectError> {
            self.tick();
            self.inner.set_mig_mode(g, e)
        }
        fn reset_gpu(&mut self, g: &str) -> Result<(), EffectError> {
            self.inner.reset_gpu(g)
        }
        fn create_gi(&mut self, g: &str, p: u32, pl: Placement) -> Result<u32, EffectError> {
            self.tick();
            self.inner.create_gi(g, p, pl)
        }
        fn destroy_gi(&mut self, g: &str, gi: u32) -> Result<(), EffectError> {
            self.tick();
            self.inner.destroy_gi(g, gi)
        }
        fn create_ci(
            &mut self,
            g: &str,
            gi: u32,
            p: u32,
            pl: Placement,
        ) -> Result<u32, EffectError> {
            self.tick();
            self.inner.create_ci(g, gi, p, pl)
        }
        fn destroy_ci(&mut self, g: &str, gi: u32, ci: u32) -> Result<(), EffectError> {
            self.tick();
            self.inner.destroy_ci(g, gi, ci)
        }
    }
    impl OwnerLabels for Crashing {
        fn set_owner(&mut self, g: &str, gi: u32, o: &str) -> Result<(), EffectError> {
            self.inner.set_owner(g, gi, o)
        }
    }
    impl UnitEffector for Crashing {
        fn stop_units(&mut self, u: &[String], t: Duration) -> Result<(), EffectError> {
            self.inner.stop_units(u, t)
        }
        fn start_units(&mut self, u: &[String]) -> Result<(), EffectError> {
            self.inner.start_units(u)
        }
    }
    impl SliceEffector for Crashing {
        fn set_slice(&mut self, t: &TeamName, s: &SliceSpec) -> Result<(), EffectError> {
            self.inner.set_slice(t, s)
        }
        fn remove_slice(&mut self, t: &TeamName) -> Result<(), EffectError> {
            self.inner.remove_slice(t)
        }
    }
    impl MpsEffector for Crashing {
        fn start_mps(&mut self, i: &str, s: &MpsSpec) -> Result<(), EffectError> {
            self.inner.start_mps(i, s)
        }
        fn stop_mps(&mut self, i: &str) -> Result<(), EffectError> {
            self.inner.stop_mps(i)
        }
    }
    impl FileEffector for Crashing {
        fn write_env(&mut self, t: &TeamName, c: &str) -> Result<(), EffectError> {
            self.inner.write_env(t, c)
        }
        fn remove_env(&mut self, t: &TeamName) -> Result<(), EffectError> {
            self.inner.remove_env(t)
        }
        fn write_cdi(&mut self, t: &TeamName, c: &str, r: &[String]) -> Result<(), EffectError> {
            self.inner.write_cdi(t, c, r)
        }
        fn remove_cdi(&mut self, t: &TeamName) -> Result<(), EffectError> {
            self.inner.remove_cdi(t)
        }
        fn create_cap_nodes(&mut self, m: &[u32]) -> Result<(), EffectError> {
            self.inner.create_cap_nodes(m)
        }
    }
    impl gpuctl::apply::SlurmEffector for Crashing {
        fn drain_node(&mut self, n: &str, r: &str) -> Result<(), EffectError> {
            self.inner.drain_node(n, r)
        }
        fn resume_node(&mut self, n: &str) -> Result<(), EffectError> {
            self.inner.resume_node(n)
        }
        fn write_gres(&mut self, p: &std::path::Path, c: &str) -> Result<(), EffectError> {
            self.inner.write_gres(p, c)
        }
        fn reload_slurm(&mut self, r: &[String]) -> Result<(), EffectError> {
            self.inner.reload_slurm(r)
        }
    }
}

fn crash_at(fake: &FakeHost, p: &gpuctl::policy::Policy, k: u32) {
    let mut h = Crashing {
        inner: fake.host(),
        left: k,
    };
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fake.apply_on(p, &mut h)));
    assert!(res.is_err(), "crash at step {k} did not happen");
}

#[test]
fn crash_mid_apply_rolls_forward_with_a_fresh_process() {
    for k in 1..=6 {
        let fake = FakeHost::new("h100*2");
        let (p1, busy) = fault_setup(&fake);
        crash_at(&fake, &p1, k);
        let j: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(fake.journal_path()).unwrap()).unwrap();
        assert!(
            j["gpus"].as_object().is_some_and(|g| !g.is_empty()),
            "k={k}: journal records the open transaction: {j}"
        );
        // A new process, a new NVML handle: the journal is found, the plan rolls forward.
        let r = fake.apply(&p1);
        assert!(!r.recovered.is_empty(), "k={k}");
        assert!(r.failed.is_empty(), "k={k}: {:?}", r.failed);
        let after = fake.observe();
        assert!(mig_part(&plan::plan(&p1, &after)).is_empty(), "k={k}");
        assert!(!fake.journal_path().exists());
        assert_safe(&fake, busy);
    }
}

#[test]
fn crash_then_unreachable_target_rolls_back_to_the_last_good_geometry() {
    let fake = FakeHost::new("h100");
    let p1 = policy(fake.dir.path(), "p1.toml", &seven("1g.10gb"));
    fake.apply(&p1);
    let good = layout(&fake.observe(), 0);
    // Target: one 4g (slices 0-3 only) for a, and three 1g for e..g.
    let target = format!(
        "version = 1\n{}\n[[gpu]]\nindex = [0]\nmig = [ {{ profile = \"4g.40gb\", owner = \"a\" }},\n\
         {{ profile = \"1g.10gb\", owner = \"e\" }}, {{ profile = \"1g.10gb\", owner = \"f\" }},\n\
         {{ profile = \"1g.10gb\", owner = \"g\" }} ]\n",
        teams(&["a", "b", "c", "d", "e", "f", "g"])
    );
    let p2 = policy(fake.dir.path(), "p2.toml", &target);
    // Die after two destroys (CI then GI of the first 1g), at the second GI's CI destroy.
    crash_at(&fake, &p2, 3);
    let mid = layout(&fake.observe(), 0);
    assert_eq!(mid.len(), 6, "{mid:?}");
    // Before the next run a job starts on another instance in slices 0-3: the 4g can no
    // longer be placed while it runs (when-idle), so the target is out of reach.
    let obs = fake.observe();
    let victim = obs.gpus[0]
        .mig
        .as_ref()
        .unwrap()
        .instances
        .iter()
        .find(|g| g.placement.start < 4)
        .unwrap()
        .clone();
    fake.add_process(0, victim.id, victim.compute[0].id, 77, "late.service");
    let r = fake.apply(&p2);
    assert!(
        r.recovered.iter().any(|l| l.contains("rolled back")),
        "{:?}",
        r.recovered
    );
    assert!(!r.restored.is_empty());
    assert_eq!(layout(&fake.observe(), 0), good, "last good geometry back");
}

#[test]
fn a100_mig_enable_resets_only_that_gpu_and_reports_pending_when_busy() {
    let fake = FakeHost::new("a100*2");
    let pol = "version = 1\n[teams.a]\nmembers=[\"@a\"]\n[[gpu]]\nindex = [0, 1]\n\
               mig = [ { profile = \"3g.20gb\", owner = \"a\", count = 2 } ]\n";
    let p = policy(fake.dir.path(), "p.toml", pol);
    // A whole-GPU process on GPU 1 holds it: its enable stays pending, GPU 0 proceeds.
    fake_nvml::control::add_process(
        &fake.state,
        fake_nvml::state::Process {
            pid: 99,
            gpu: 1,
            gi: None,
            ci: None,
            used_memory_mib: 1,
        },
    )
    .unwrap();
    let r = fake.apply(&p);
    let resets: Vec<_> = fake
        .log()
        .into_iter()
        .filter(|(f, _, _)| f == "fakeNvmlResetGpu")
        .collect();
    assert_eq!(resets.len(), 1, "{resets:?}");
    assert_eq!(resets[0].2["gpu"], 0);
    let after = fake.observe();
    assert_eq!(layout(&after, 0).len(), 2);
    assert!(r
        .pending
        .iter()
        .any(|p| p.index == 1 && p.reason.contains("needs GPU reset: processes hold it")));
    assert!(r.pending.iter().all(|p| p.index != 0));
}

#[test]
fn observes_through_nvml_with_minors_and_processes() {
    let fake = FakeHost::new("h100,l40s");
    let o = fake.observe();
    assert_eq!(o.gpus.len(), 2);
    assert_eq!(o.gpus[0].model.as_deref(), Some("H100-SXM5-80GB"));
    assert!(o.gpus[0].mig.is_some() && o.gpus[1].mig.is_none());
    assert!(o.nvml_unavailable.is_none());
    let mut h = fake.host();
    let e = gpuctl::apply::GpuEffector::create_gi(
        &mut h,
        &o.gpus[0].uuid,
        19,
        gpuctl::profiles::Placement { start: 0, size: 1 },
    )
    .unwrap_err();
    // MIG is off: the error names the GPU.
    assert!(e.to_string().contains(&o.gpus[0].uuid), "{e}");
    assert!(matches!(e, EffectError::Other { .. }));
    assert!(h.observe().is_ok());
}

#[test]
fn a_job_started_after_the_observation_is_seen_before_its_instance_is_destroyed() {
    use gpuctl::apply::execute_observed;
    use gpuctl::apply::journal::FileJournal;
    use gpuctl::paths::Root;
    let fake = FakeHost::new("h100");
    let p1 = policy(fake.dir.path(), "p1.toml", &seven("1g.10gb"));
    assert!(fake.apply(&p1).failed.is_empty());
    let p2 = policy(fake.dir.path(), "p2.toml", &seven("1g.10gb+me"));
    let mut h = fake.host();
    let obs = h.observe().unwrap();
    let pl = plan::plan(&p2, &obs);
    // The plan releases g's idle instance; a job lands on it before the executor gets there.
    let g = obs.gpus[0]
        .mig
        .as_ref()
        .unwrap()
        .instances
        .iter()
        .find(|i| i.owner.as_deref() == Some("g"))
        .unwrap()
        .clone();
    fake.add_process(0, g.id, g.compute[0].id, 4242, "late.service");
    let before = fake.log().len();
    let mut j = FileJournal::new(&Root::new(&fake.root));
    let r = execute_observed(&p2, &pl, obs, &mut h, &mut j, None).unwrap();
    let destroys: Vec<_> = fake.log()[before..]
        .iter()
        .filter(|(f, _, _)| f.contains("Destroy"))
        .cloned()
        .collect();
    assert!(destroys.is_empty(), "{destroys:?}");
    let refused = r
        .failed
        .iter()
        .map(|(_, e)| e.to_string())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(refused.contains("pid 4242 (late.service)"), "{refused}");
    assert!(layout(&fake.observe(), 0)
        .iter()
        .any(|x| x.3.as_deref() == Some("g")));
}

#[test]
fn an_apply_queries_only_the_gpus_it_changed_and_sees_what_a_full_observation_sees() {
    let fake = FakeHost::new("h100*3");
    let three = |last: &str| {
        let one = seven(last);
        let geo = &one[one.find("mig = [").unwrap()..];
        let head = &one[..one.find("[[gpu]]").unwrap()];
        let seven_1g = seven("1g.10gb");
        let geo_1g = &seven_1g[seven_1g.find("mig = [").unwrap()..];
        format!(
            "{head}[[gpu]]\nindex = [0]\n{geo_1g}[[gpu]]\nindex = [1]\n{geo_1g}\
             [[gpu]]\nindex = [2]\n{geo}"
        )
    };
    let p1 = policy(fake.dir.path(), "p1.toml", &three("1g.10gb"));
    assert!(fake.apply(&p1).failed.is_empty());

    // Converged: no query after the observation the plan was made from.
    let mut h = fake.host();
    let obs = h.observe().unwrap();
    let q0 = fake.query_calls();
    let r = fake.apply_observed(&p1, &mut h, obs);
    assert_eq!(fake.query_calls(), q0, "a converged apply queried NVML");
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    assert!(mig_part(&plan::plan(&p1, &fake.observe())).is_empty());

    // One GPU changes: the other two are not queried again, and the executor's picture of
    // the host afterwards is the one a full observation gives.
    let p2 = policy(fake.dir.path(), "p2.toml", &three("1g.10gb+me"));
    let obs = h.observe().unwrap();
    let full = {
        let q = fake.query_calls();
        h.observe().unwrap();
        fake.query_calls() - q
    };
    let q0 = fake.query_calls();
    let r = fake.apply_observed(&p2, &mut h, obs);
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    assert!(mig_part(&r.remaining).is_empty(), "{:?}", r.remaining);
    let used = fake.query_calls() - q0;
    assert!(
        used < full / 2,
        "{used} queries for one GPU of three (a full observation is {full})"
    );
    let after = fake.observe();
    assert_eq!(plan::plan(&p2, &after), r.remaining);
    assert!(layout(&after, 2)
        .iter()
        .any(|x| x.0 == "1g.10gb+me" && x.3.as_deref() == Some("g")));
}

/// nvidia-smi(1): a GPU reset needs the GPU free of other clients, monitoring ones included.
/// gpuctl's own NVML is shut down before the reset command runs, and opened again at the next
/// call.
#[test]
fn a_reset_command_runs_after_gpuctl_lets_go_of_nvml() {
    use std::os::unix::fs::PermissionsExt;
    let fake = FakeHost::new("a100*2");
    let log = fake.dir.path().join("resets.log");
    let cmd = fake.dir.path().join("reset.sh");
    std::fs::write(
        &cmd,
        format!("#!/bin/sh\necho \"$@\" >> {}\n", log.display()),
    )
    .unwrap();
    std::fs::set_permissions(&cmd, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::env::set_var(
        "GPUCTL_GPU_RESET_CMD",
        format!("{} -i {{index}} {{uuid}}", cmd.display()),
    );
    let mut h = fake.host();
    let uuid = h.observe().unwrap().gpus[1].uuid.clone();
    assert_eq!(fakehost::open_inits(), 1);

    gpuctl::apply::GpuEffector::reset_gpu(&mut h, &uuid).unwrap();
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        format!("-i 1 {uuid}\n"),
        "the command and its arguments"
    );
    assert_eq!(fakehost::open_inits(), 0, "NVML held open across the reset");
    // The next call opens NVML again.
    assert_eq!(h.observe().unwrap().gpus.len(), 2);
    assert_eq!(fakehost::open_inits(), 1);
}

#[test]
fn empty_mig_through_nvml_turns_mig_on_and_destroys_only_idle_instances() {
    let fake = FakeHost::new("h100*2");
    let two = "[[gpu]]\nindex = [0]\nmig = [ { profile = \"3g.40gb\", owner = \"a\" }, \
               { profile = \"3g.40gb\", owner = \"b\" } ]\n";
    let empty1 = "[[gpu]]\nindex = [1]\nmig = []\n";
    let head = format!("version = 1\n{}\n", teams(&["a", "b"]));
    let p1 = policy(fake.dir.path(), "p1.toml", &format!("{head}{two}{empty1}"));
    let r = fake.apply(&p1);
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    let obs = fake.observe();
    let m1 = obs.gpus[1].mig.as_ref().unwrap();
    assert!(m1.current && m1.instances.is_empty(), "{m1:?}");
    assert_eq!(layout(&obs, 0).len(), 2);
    assert!(mig_part(&plan::plan(&p1, &obs)).is_empty());

    // Team a's instance runs a job; gpu 0 goes to mig = [] too.
    let busy = obs.gpus[0]
        .mig
        .as_ref()
        .unwrap()
        .instances
        .iter()
        .find(|g| g.owner.as_deref() == Some("a"))
        .unwrap()
        .clone();
    fake.add_process(0, busy.id, busy.compute[0].id, 4242, "train.service");
    let empty0 = "[[gpu]]\nindex = [0]\nmig = []\n";
    let p2 = policy(
        fake.dir.path(),
        "p2.toml",
        &format!("{head}{empty0}{empty1}"),
    );
    let before = fake.log().len();
    let r = fake.apply(&p2);
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    let log = fake.log();
    let destroyed: Vec<u64> = log[before..]
        .iter()
        .filter(|(f, res, _)| f == "nvmlGpuInstanceDestroy" && res == "NVML_SUCCESS")
        .map(|(_, _, a)| a["gpuInstanceId"].as_u64().unwrap())
        .collect();
    assert_eq!(destroyed.len(), 1, "{:?}", &log[before..]);
    assert_ne!(
        destroyed[0],
        u64::from(busy.id),
        "destroyed the busy instance"
    );
    assert!(!log[before..]
        .iter()
        .any(|(f, _, _)| f == "nvmlDeviceSetMigMode"));
    let blocked = &r.remaining.blocked;
    assert_eq!(blocked.len(), 1, "{blocked:?}");
    assert!(
        blocked[0].holders[0].contains("train.service"),
        "{blocked:?}"
    );
    assert!(blocked[0]
        .reason
        .contains("is not in the policy but processes hold it"));
    let after = fake.observe();
    assert_eq!(layout(&after, 0).len(), 1);
    assert!(after.gpus[0].mig.as_ref().unwrap().current);

    // The job ends: the last instance goes, and the plan after that is empty.
    fake_nvml::control::remove_process(&fake.state, 4242).unwrap();
    let r = fake.apply(&p2);
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    let after = fake.observe();
    assert!(layout(&after, 0).is_empty());
    assert!(mig_part(&plan::plan(&p2, &after)).is_empty());
}
