//! A private fake NVML host per test: the real `nvml-wrapper` code of gpuctl's backend loads
//! `libfake_nvml.so`, whose state lives in a temp dir. The fake reads its environment at every
//! call and the environment is process-global, so tests of one binary take turns.
#![allow(dead_code)]

use gpuctl::apply::journal::FileJournal;
use gpuctl::apply::{execute_observed, Observer, Report};
use gpuctl::observe::Observed;
use gpuctl::paths::Root;
use gpuctl::plan::{self, ActionKind, Phase, Plan};
use gpuctl::policy::Policy;
use gpuctl::real::RealHost;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

static SERIAL: Mutex<()> = Mutex::new(());

/// `libfake_nvml.so`: `$FAKE_NVML_LIB`, else next to the test executable (`deps/`) or one level
/// up. gpuctl dev-depends on fake-nvml, so cargo builds the cdylib before any test runs.
pub fn lib_path() -> PathBuf {
    if let Some(p) = std::env::var_os("FAKE_NVML_LIB") {
        return p.into();
    }
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("exe dir");
    for dir in [deps, deps.parent().unwrap_or(deps)] {
        let p = dir.join("libfake_nvml.so");
        if p.exists() {
            return p;
        }
    }
    panic!(
        "libfake_nvml.so not found near {}; set FAKE_NVML_LIB",
        exe.display()
    );
}

/// One fake host.
pub struct FakeHost {
    pub dir: tempfile::TempDir,
    pub state: PathBuf,
    pub root: PathBuf,
    _serial: MutexGuard<'static, ()>,
}

impl FakeHost {
    /// A host from a fake spec such as `h100*2` (built on first NVML call).
    pub fn new(spec: &str) -> FakeHost {
        let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("fake-nvml.json");
        let root = dir.path().join("root");
        std::fs::create_dir_all(&root).unwrap();
        // A host the size of a real 8-GPU server, so percentage limits and CPU sets resolve.
        std::fs::create_dir_all(root.join("proc")).unwrap();
        std::fs::write(root.join("proc/meminfo"), "MemTotal:       2113929216 kB\n").unwrap();
        std::fs::create_dir_all(root.join("sys/devices/system/cpu")).unwrap();
        std::fs::write(root.join("sys/devices/system/cpu/online"), "0-127\n").unwrap();
        std::env::set_var("FAKE_NVML_STATE", &state);
        std::env::set_var("FAKE_NVML_SPEC", spec);
        std::env::set_var("FAKE_NVML_ROOT", &root);
        std::env::set_var("GPUCTL_GPU_RESET_CMD", "fake:");
        std::env::remove_var("FAKE_NVML_FAIL");
        std::env::remove_var("FAKE_NVML_FAIL_AT");
        std::env::remove_var("GPUCTL_NVML_LIBRARY");
        FakeHost {
            dir,
            state,
            root,
            _serial: guard,
        }
    }

    /// A fresh backend, as a new `gpuctl apply --local` process would open it.
    pub fn host(&self) -> RealHost {
        RealHost::open(Root::new(&self.root), Some(lib_path()))
    }

    pub fn observe(&self) -> Observed {
        self.host().observe().expect("observe")
    }

    /// What `gpuctl apply --local` does: observe, plan, execute with the file journal (the
    /// executor reuses the observation the plan was made from).
    pub fn apply(&self, p: &Policy) -> Report {
        let mut h = self.host();
        self.apply_on(p, &mut h)
    }

    pub fn apply_on<H: gpuctl::apply::Host>(&self, p: &Policy, h: &mut H) -> Report {
        let obs = h.observe().expect("observe");
        self.apply_observed(p, h, obs)
    }

    /// [`FakeHost::apply_on`] from an observation the caller made.
    pub fn apply_observed<H: gpuctl::apply::Host>(
        &self,
        p: &Policy,
        h: &mut H,
        obs: Observed,
    ) -> Report {
        let pl = plan::plan(p, &obs);
        let mut j = FileJournal::new(&Root::new(&self.root));
        // No systemd here: the phases `gpuctl apply --local` runs without a system bus.
        let phases = [Phase::MigMode, Phase::MigInstances, Phase::Devices].into();
        execute_observed(p, &pl, obs, h, &mut j, Some(&phases)).expect("execute")
    }

    pub fn journal_path(&self) -> PathBuf {
        FileJournal::new(&Root::new(&self.root))
            .path()
            .to_path_buf()
    }

    pub fn fake(&self) -> fake_nvml::state::State {
        fake_nvml::control::read(&self.state).expect("fake state")
    }

    pub fn mutating_calls(&self) -> u64 {
        self.fake().mutating_calls
    }

    /// Read-only NVML calls this process made so far (`nvmlInit` included), from the loaded
    /// fake's own counter (the rlib copy of fake-nvml linked into the test has a separate one).
    pub fn query_calls(&self) -> u64 {
        query_calls()
    }

    /// (function, result) of the logged calls.
    pub fn log(&self) -> Vec<(String, String, serde_json::Value)> {
        self.fake()
            .call_log
            .into_iter()
            .map(|r| (r.function, r.result, r.args))
            .collect()
    }

    /// Adds a process on MIG device (gi, ci) of GPU `gpu`, with a systemd unit in its cgroup.
    pub fn add_process(&self, gpu: u32, gi: u32, ci: u32, pid: u32, unit: &str) {
        let rc = fake_nvml::control::add_process(
            &self.state,
            fake_nvml::state::Process {
                pid,
                gpu,
                gi: Some(gi),
                ci: Some(ci),
                used_memory_mib: 100,
            },
        )
        .unwrap();
        assert_eq!(rc, 0, "add_process");
        let p = self.root.join(format!("proc/{pid}/cgroup"));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, format!("0::/system.slice/{unit}\n")).unwrap();
    }
}

/// See [`FakeHost::query_calls`].
pub fn query_calls() -> u64 {
    let mut n = 0u64;
    // SAFETY: fakeNvmlQueryCallCount has the C signature `nvmlReturn_t (unsigned long long *)`.
    assert_eq!(
        unsafe { counter::<u64>(b"fakeNvmlQueryCallCount\0", &mut n) },
        0
    );
    n
}

/// `nvmlInit`s of this process not yet shut down, as the loaded fake counts them.
pub fn open_inits() -> u32 {
    let mut n = 0u32;
    // SAFETY: fakeNvmlInitCount has the C signature `nvmlReturn_t (unsigned int *)`.
    assert_eq!(unsafe { counter::<u32>(b"fakeNvmlInitCount\0", &mut n) }, 0);
    n
}

/// Calls the fake's counter `symbol` (`nvmlReturn_t (T *)`) in the library nvml-wrapper loads.
///
/// # Safety
/// `symbol` must have that signature.
unsafe fn counter<T>(symbol: &[u8], out: &mut T) -> u32 {
    // Held open for the whole process: otherwise the last backend's dlclose could unload the
    // library and restart its counters.
    static LIB: std::sync::OnceLock<libloading::Library> = std::sync::OnceLock::new();
    // SAFETY: the library nvml-wrapper loads (dlopen returns the same handle); the signature
    // is the caller's contract.
    unsafe {
        let lib = LIB.get_or_init(|| libloading::Library::new(lib_path()).expect("load fake NVML"));
        let f: libloading::Symbol<unsafe extern "C" fn(*mut T) -> u32> =
            lib.get(symbol).expect("fake NVML counter symbol");
        f(out)
    }
}

/// A policy from TOML text (through the real loader).
pub fn policy(dir: &Path, name: &str, toml: &str) -> Policy {
    let f = dir.join(name);
    std::fs::write(&f, toml).unwrap();
    let out = gpuctl::policy::load_files(&[f]);
    // Warnings (teams without GPUs in small test policies) would only be noise.
    for d in out
        .diagnostics
        .iter()
        .filter(|d| d.severity == gpuctl::policy::Severity::Error)
    {
        eprintln!("{d}");
    }
    out.policy.expect("policy loads")
}

/// The MIG actions and GPU-level blocks of a plan (the parts the fake host can carry out).
pub fn mig_part(p: &Plan) -> Vec<String> {
    p.actions
        .iter()
        .filter(|a| matches!(a.phase, Phase::MigMode | Phase::MigInstances))
        .map(|a| a.kind.to_string())
        .chain(p.blocked.iter().map(|b| format!("blocked: {}", b.reason)))
        .collect()
}

/// GI layout of a GPU: (profile, start, size, owner, CI (profile, start, size)).
pub type Layout = Vec<(String, u32, u32, Option<String>, Vec<(String, u32, u32)>)>;

pub fn layout(o: &Observed, index: u32) -> Layout {
    let mut l: Layout = o
        .gpu(index)
        .and_then(|g| g.mig.as_ref())
        .map(|m| {
            m.instances
                .iter()
                .map(|gi| {
                    let mut cis: Vec<_> = gi
                        .compute
                        .iter()
                        .map(|c| (c.profile.clone(), c.placement.start, c.placement.size))
                        .collect();
                    cis.sort();
                    (
                        gi.profile.clone(),
                        gi.placement.start,
                        gi.placement.size,
                        gi.owner.clone(),
                        cis,
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    l.sort_by_key(|x| (x.1, x.2));
    l
}

/// Whether a kind destroys something.
pub fn is_destroy(k: &ActionKind) -> bool {
    matches!(
        k,
        ActionKind::DestroyGi { .. } | ActionKind::DestroyCi { .. }
    )
}
