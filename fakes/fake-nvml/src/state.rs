//! The shared GPU state: a JSON file, read and written under an exclusive `flock`
//! on a sibling `<state>.lock` file so that every process sees one driver.

use crate::model::{find_model, intern_model, Model, ModelDef};
use crate::types::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// Env var naming the state file.
pub const ENV_STATE: &str = "FAKE_NVML_STATE";
/// Env var with a compact spec (`h100-80gb*2,a100-40gb`) used when the state file is missing.
pub const ENV_SPEC: &str = "FAKE_NVML_SPEC";
/// Env var naming a root directory under which `proc/driver/nvidia-caps/mig-minors` is written.
pub const ENV_ROOT: &str = "FAKE_NVML_ROOT";
/// Env var: `fn:CODE[,fn:CODE…]` — the named functions fail with CODE.
pub const ENV_FAIL: &str = "FAKE_NVML_FAIL";
/// Env var: `N:CODE[,N:CODE…]` — mutating call number N (1-based, counted in the state) fails.
pub const ENV_FAIL_AT: &str = "FAKE_NVML_FAIL_AT";

/// Whole fake-driver state.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct State {
    /// Physical GPUs, in NVML index order.
    #[serde(default)]
    pub gpus: Vec<Gpu>,
    /// Fake processes holding GPUs.
    #[serde(default)]
    pub processes: Vec<Process>,
    /// Fault injection.
    #[serde(default)]
    pub faults: Faults,
    /// Number of mutating NVML calls made so far (failed ones included).
    #[serde(default)]
    pub mutating_calls: u64,
    /// One record per mutating call.
    #[serde(default)]
    pub call_log: Vec<CallRecord>,
    /// Source of unique instance serials (handles and MIG UUIDs derive from them).
    #[serde(default)]
    pub next_serial: u64,
    /// Models defined by this state, by key, in the reference file's schema. A GPU's `model`
    /// names one of these before the built-in models, so a state can replay a recorded
    /// driver's profile tables (`gpuctl doctor --record`) or carry a tampered one.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub models: BTreeMap<String, ModelDef>,
    /// Utilisation, power, temperature, graphics processes and GPM activity.
    #[serde(default)]
    pub usage: crate::usage::UsageModel,
    /// Health counters and raised events (`crate::health`).
    #[serde(default)]
    pub health: crate::health::HealthModel,
}

/// MIG mode pair as `nvmlDeviceGetMigMode` reports it.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct MigMode {
    /// Mode in effect.
    #[serde(default)]
    pub current: u32,
    /// Mode after the next reset.
    #[serde(default)]
    pub pending: u32,
}

/// One physical GPU.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Gpu {
    /// Model key or alias (see README).
    pub model: String,
    /// `GPU-…` UUID; generated deterministically from the index when empty.
    #[serde(default)]
    pub uuid: String,
    /// `/dev/nvidiaN` minor; defaults to the index.
    #[serde(default)]
    pub minor: Option<u32>,
    /// PCI bus number; defaults to a per-index value.
    #[serde(default)]
    pub pci_bus: Option<u32>,
    /// MIG mode.
    #[serde(default)]
    pub mig: MigMode,
    /// Whether the reset that `nvmlDeviceSetMigMode` attempts on reset-requiring models
    /// (A100/A30) succeeds. Default false: on real servers another client
    /// (nvidia-persistenced, DCGM) usually holds the GPU, so the change stays pending.
    #[serde(default)]
    pub inline_reset_ok: bool,
    /// GPU instances.
    #[serde(default)]
    pub gpu_instances: Vec<GpuInstance>,
    /// The model `model` names, resolved by [`State::normalize`] (state-defined or built-in).
    #[serde(skip)]
    pub resolved: Option<&'static Model>,
}

/// A GPU instance.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GpuInstance {
    /// GI id (0..=14).
    pub id: u32,
    /// Published GI profile ID.
    pub profile_id: u32,
    /// Placement start (memory slices).
    pub start: u32,
    /// Placement size (memory slices).
    pub size: u32,
    /// Unique serial (handle identity).
    #[serde(default)]
    pub serial: u64,
    /// Compute instances.
    #[serde(default)]
    pub compute_instances: Vec<ComputeInstance>,
}

/// A compute instance (= one MIG device).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ComputeInstance {
    /// CI id (0..=7).
    pub id: u32,
    /// Published CI profile ID.
    pub profile_id: u32,
    /// Placement start (compute slices of the GI).
    pub start: u32,
    /// Placement size.
    pub size: u32,
    /// Unique serial.
    #[serde(default)]
    pub serial: u64,
    /// `MIG-…` UUID.
    #[serde(default)]
    pub uuid: String,
}

/// A fake process using a GPU.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Process {
    /// PID.
    pub pid: u32,
    /// GPU index.
    pub gpu: u32,
    /// GI id, `None` outside MIG.
    #[serde(default)]
    pub gi: Option<u32>,
    /// CI id, `None` outside MIG.
    #[serde(default)]
    pub ci: Option<u32>,
    /// Used memory in MiB.
    #[serde(default)]
    pub used_memory_mib: u64,
}

/// Fault knobs stored in the state (the env vars add to them).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Faults {
    /// Function name → return code (name or number); fails every call until removed.
    #[serde(default)]
    pub fail: BTreeMap<String, String>,
    /// Mutating call numbers that fail once.
    #[serde(default)]
    pub fail_at: Vec<FailAt>,
    /// Mutating function name → return code: its next call fails once (the entry goes), as a
    /// driver refusing one step of a longer change.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fail_once: BTreeMap<String, String>,
}

/// "The mutating call whose number is `call` fails with `code`."
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FailAt {
    /// 1-based value of `mutating_calls` after counting the failing call.
    pub call: u64,
    /// Return code, name or number.
    pub code: String,
}

/// One logged mutating call.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CallRecord {
    /// Mutating call number.
    pub seq: u64,
    /// Exported function name.
    pub function: String,
    /// Arguments as decoded by the fake (gpu index, ids, profile, placement).
    pub args: serde_json::Value,
    /// Return code name.
    pub result: String,
}

impl Gpu {
    /// A fresh GPU of `model` (must be a known key).
    pub fn new(model: &str) -> Gpu {
        Gpu {
            model: model.to_string(),
            uuid: String::new(),
            minor: None,
            pci_bus: None,
            mig: MigMode::default(),
            inline_reset_ok: false,
            gpu_instances: Vec::new(),
            resolved: None,
        }
    }
    /// The model (validated when the state is loaded).
    pub fn model(&self) -> &'static Model {
        self.resolved
            .or_else(|| find_model(&self.model))
            .expect("model validated on load")
    }
    /// Minor number.
    pub fn minor_number(&self, index: usize) -> u32 {
        self.minor.unwrap_or(index as u32)
    }
}

/// FNV-1a, used to derive stable UUIDs.
fn fnv1a(data: &[u8], seed: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// A UUID-shaped string derived from `key`.
pub fn derive_uuid(key: &str) -> String {
    let a = fnv1a(key.as_bytes(), 1);
    let b = fnv1a(key.as_bytes(), 2);
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}

impl State {
    /// Builds a state from a spec like `h100-80gb*2,a100-40gb,l40s`.
    pub fn from_spec(spec: &str) -> Result<State, String> {
        let mut st = State::default();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (name, count) = match item.split_once('*') {
                Some((n, c)) => (
                    n,
                    c.trim()
                        .parse::<usize>()
                        .map_err(|_| format!("{ENV_SPEC}: bad count in {item:?}"))?,
                ),
                None => (item, 1),
            };
            let model =
                find_model(name).ok_or_else(|| format!("{ENV_SPEC}: unknown model {name:?}"))?;
            for _ in 0..count {
                st.gpus.push(Gpu::new(&model.key));
            }
        }
        st.normalize()?;
        Ok(st)
    }

    /// Validates models and fills defaults (UUIDs, serials). Idempotent.
    pub fn normalize(&mut self) -> Result<(), String> {
        self.next_serial = self.next_serial.max(1);
        for (i, g) in self.gpus.iter_mut().enumerate() {
            let model = match self.models.get(&g.model) {
                Some(def) => intern_model(&g.model, def),
                None => find_model(&g.model)
                    .ok_or_else(|| format!("gpus[{i}].model: unknown model {:?}", g.model))?,
            };
            g.model = model.key.clone();
            g.resolved = Some(model);
            if g.uuid.is_empty() {
                g.uuid = format!("GPU-{}", derive_uuid(&format!("{}/{}", model.key, i)));
            }
        }
        // Hand-written instances may lack serials; give them unique ones.
        let mut next = self.next_serial;
        for g in &mut self.gpus {
            for gi in &mut g.gpu_instances {
                if gi.serial == 0 {
                    gi.serial = next;
                    next += 1;
                }
                for ci in &mut gi.compute_instances {
                    if ci.serial == 0 {
                        ci.serial = next;
                        next += 1;
                    }
                    if ci.uuid.is_empty() {
                        ci.uuid =
                            format!("MIG-{}", derive_uuid(&format!("{}/{}", g.uuid, ci.serial)));
                    }
                }
            }
        }
        let max_serial = self
            .gpus
            .iter()
            .flat_map(|g| g.gpu_instances.iter())
            .flat_map(|gi| {
                std::iter::once(gi.serial).chain(gi.compute_instances.iter().map(|c| c.serial))
            })
            .max()
            .unwrap_or(0);
        self.next_serial = next.max(max_serial + 1);
        Ok(())
    }

    /// Takes a fresh serial.
    pub fn alloc_serial(&mut self) -> u64 {
        let s = self.next_serial;
        self.next_serial += 1;
        s
    }
}

/// Why the state could not be used.
#[derive(Debug)]
pub enum StateError {
    /// No state file and no spec: behaves like a host without the NVIDIA driver.
    Missing(PathBuf),
    /// I/O or parse failure; the message names the path.
    Broken(String),
}

impl StateError {
    /// The NVML code a call reports for this error.
    pub fn code(&self) -> NvmlReturn {
        match self {
            StateError::Missing(_) => NVML_ERROR_DRIVER_NOT_LOADED,
            StateError::Broken(_) => NVML_ERROR_UNKNOWN,
        }
    }
}

impl std::fmt::Display for StateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateError::Missing(p) => {
                write!(f, "{}: no state file and {ENV_SPEC} unset", p.display())
            }
            StateError::Broken(m) => f.write_str(m),
        }
    }
}

fn lock_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".lock");
    PathBuf::from(s)
}

/// Holds the exclusive lock while alive (closing the fd releases the `flock`).
struct LockGuard {
    _file: File,
}

fn lock(path: &Path) -> Result<LockGuard, StateError> {
    let lp = lock_path(path);
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&lp)
        .map_err(|e| StateError::Broken(format!("{}: {e}", lp.display())))?;
    loop {
        // SAFETY: flock on a file descriptor we own; no memory is involved.
        let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
        if rc == 0 {
            return Ok(LockGuard { _file: f });
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(StateError::Broken(format!("flock {}: {err}", lp.display())));
        }
    }
}

fn parse(path: &Path, text: &str) -> Result<State, StateError> {
    let mut st: State = serde_json::from_str(text)
        .map_err(|e| StateError::Broken(format!("{}: {e}", path.display())))?;
    st.normalize()
        .map_err(|e| StateError::Broken(format!("{}: {e}", path.display())))?;
    Ok(st)
}

fn read_unlocked(path: &Path, spec: Option<&str>) -> Result<(State, bool), StateError> {
    match fs::read_to_string(path) {
        Ok(text) => Ok((parse(path, &text)?, false)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => match spec {
            Some(spec) => State::from_spec(spec)
                .map(|s| (s, true))
                .map_err(StateError::Broken),
            None => Err(StateError::Missing(path.to_path_buf())),
        },
        Err(e) => Err(StateError::Broken(format!("{}: {e}", path.display()))),
    }
}

/// Writes the state atomically (temp file in the same directory, then rename).
pub fn write_unlocked(path: &Path, st: &State) -> Result<(), StateError> {
    let broken = |e: std::io::Error| StateError::Broken(format!("{}: {e}", path.display()));
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp.{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let text = serde_json::to_string_pretty(st).expect("state serializes");
    let mut f = File::create(&tmp).map_err(broken)?;
    f.write_all(text.as_bytes()).map_err(broken)?;
    f.write_all(b"\n").map_err(broken)?;
    drop(f);
    fs::rename(&tmp, path).map_err(broken)
}

/// The last state this process parsed or wrote, with the file's text: every NVML call goes
/// through [`with_state`], and parsing the JSON each time dominated gpuctld's time in VM 65
/// (8 GPUs x 7 MIG devices: `gpuctl plan` took 20 s in the guest). The file is still read on
/// every call (another process may have written it); only an unchanged text skips the parse.
static CACHE: std::sync::Mutex<Option<(PathBuf, String, State)>> = std::sync::Mutex::new(None);

fn read_cached(path: &Path, spec: Option<&str>) -> Result<(State, bool), StateError> {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        // Missing or unreadable: the plain path says what to do.
        Err(_) => return read_unlocked(path, spec),
    };
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((p, t, st)) = cache.as_ref() {
        if p == path && *t == text {
            return Ok((st.clone(), false));
        }
    }
    let st = parse(path, &text)?;
    *cache = Some((path.to_path_buf(), text, st.clone()));
    Ok((st, false))
}

/// Runs `f` on the state at `path` under the lock; writes it back if `f` says it changed it
/// (or if the state was just created from `spec`).
pub fn with_state<R>(
    path: &Path,
    spec: Option<&str>,
    f: impl FnOnce(&mut State) -> (R, bool),
) -> Result<R, StateError> {
    let _guard = lock(path)?;
    let (mut st, created) = read_cached(path, spec)?;
    let (r, changed) = f(&mut st);
    if changed || created {
        write_unlocked(path, &st)?;
    }
    Ok(r)
}

/// Content of `/proc/driver/nvidia-caps/mig-minors` in the real driver's layout:
/// `config 1`, `monitor 2`, then per GPU 15 GIs each followed by its 8 CIs, numbered from 3.
pub fn mig_minors_text(gpu_count: u32) -> String {
    let mut out = String::from("config 1\nmonitor 2\n");
    let mut n = 3u32;
    for g in 0..gpu_count {
        for gi in 0..=14 {
            out.push_str(&format!("gpu{g}/gi{gi}/access {n}\n"));
            n += 1;
            for ci in 0..=7 {
                out.push_str(&format!("gpu{g}/gi{gi}/ci{ci}/access {n}\n"));
                n += 1;
            }
        }
    }
    out
}

/// The driver's table covers 32 GPUs whatever is installed; larger minors extend it.
pub fn write_mig_minors(root: &Path, st: &State) -> std::io::Result<()> {
    let max_minor = st
        .gpus
        .iter()
        .enumerate()
        .map(|(i, g)| g.minor_number(i) + 1)
        .max()
        .unwrap_or(0);
    let dir = root.join("proc/driver/nvidia-caps");
    fs::create_dir_all(&dir)?;
    let path = dir.join("mig-minors");
    let mut tmp = path.clone().into_os_string();
    tmp.push(format!(".tmp.{}", std::process::id()));
    fs::write(&tmp, mig_minors_text(max_minor.max(32)))?;
    fs::rename(&tmp, &path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_builds_gpus_in_order() {
        let st = State::from_spec("h100-80gb*2, a100-40gb,l40s").unwrap();
        let models: Vec<_> = st.gpus.iter().map(|g| g.model.as_str()).collect();
        assert_eq!(
            models,
            ["H100-SXM5-80GB", "H100-SXM5-80GB", "A100-SXM4-40GB", "L40S"]
        );
        assert_ne!(st.gpus[0].uuid, st.gpus[1].uuid);
        assert!(st.gpus[0].uuid.starts_with("GPU-"));
        assert!(State::from_spec("rtx-pro-5000")
            .unwrap_err()
            .contains("rtx-pro-5000"));
        assert!(State::from_spec("h100*x").is_err());
    }

    #[test]
    fn mig_minors_numbering() {
        let t = mig_minors_text(2);
        let lines: Vec<_> = t.lines().collect();
        assert_eq!(lines[0], "config 1");
        assert_eq!(lines[1], "monitor 2");
        assert_eq!(lines[2], "gpu0/gi0/access 3");
        assert_eq!(lines[3], "gpu0/gi0/ci0/access 4");
        assert_eq!(lines[10], "gpu0/gi0/ci7/access 11");
        assert_eq!(lines[11], "gpu0/gi1/access 12");
        assert_eq!(lines[2 + 135], "gpu1/gi0/access 138");
        assert_eq!(lines.len(), 2 + 2 * 135);
    }
}
