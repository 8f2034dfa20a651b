//! `gpuctl import mig-parted`: one config of an NVIDIA mig-parted file → a gpuctl policy drop-in.
//!
//! mig-parted's format (`version: v1`, `mig-configs: NAME: [entry…]`) describes only the MIG
//! geometry: each entry selects GPUs (`devices: all | [indices]`, optionally narrowed by
//! `device-filter:` PCI device IDs) and sets `mig-enabled` and `mig-devices` (profile → count).
//! It has no owners, so every imported share gets the `--owner` team or a placeholder the admin
//! must replace (an invalid team name, so the drop-in cannot validate until they do).
//!
//! The mapping:
//! - `devices: all` → `all = true`; `devices: [0, 1]` → `index = [0, 1]`;
//!   `device-filter` (with `devices: all`) → one `[[gpu]]` per model, `model = "<reference key>"`,
//!   the PCI IDs looked up in the compiled-in catalog (`data/gpu-profiles.json`). The import is
//!   offline: a filter resolves to every model gpuctl knows among its IDs, and on a host only the
//!   entries of the models it has select GPUs, as mig-parted applies an entry only to GPUs that
//!   match its filter. A filter ID of a model gpuctl does not know is named in a [`Imported::notes`]
//!   line (gpuctl manages no MIG on such a GPU, whatever the policy says), not refused;
//! - a profile no model gpuctl knows offers (or, under a filter, one a filtered model lacks) is
//!   unsupported: it names the profile and the models that have it;
//! - `mig-enabled: false` → whole GPUs, `owner = …`;
//! - `mig-enabled: true` without devices (`mig-devices: {}`, absent, or only zero counts; the
//!   `all-enabled` config) → `mig = []`: MIG on, no instances, no team;
//! - `mig-devices: {"1g.10gb": 7}` → `mig = [{ profile = "1g.10gb", count = 7, owner = … }]`;
//!   a compute-instance name `"1c.3g.40gb": 2` → two `3g.40gb` GPU instances with one `1c`
//!   compute instance each (mig-parted creates one GI per listed device).
//!
//! What has no gpuctl equivalent is never dropped silently: every such field is returned as an
//! [`Unsupported`] with its YAML path, and the CLI refuses to write unless told to skip them.
//!
//! The YAML is walked as a generic value rather than deserialized into structs so that every
//! unknown or unsupported key is named with its full path, not rejected at the first one.

use crate::profiles::{Catalog, GpuModel};
use serde::Serialize;
use serde_norway::Value;
use std::fmt;

/// The owner written when no `--owner` is given: not a valid team name, so validation fails
/// until the admin replaces it (`gpuctl validate` then says "unknown team").
pub const OWNER_PLACEHOLDER: &str = "FILL-IN-TEAM";

/// A mig-parted field gpuctl cannot express, with its YAML path and the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsupported {
    /// YAML path, e.g. `mig-configs.custom[1].device-filter`.
    pub path: String,
    /// Why it cannot be imported.
    pub why: String,
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: unsupported: {}", self.path, self.why)
    }
}

/// The result of an import: the drop-in text, and what it leaves out.
#[derive(Debug, Clone)]
pub struct Imported {
    /// The policy drop-in (TOML, with a comment header).
    pub toml: String,
    /// Fields left out, each named; empty when the import is complete.
    pub unsupported: Vec<Unsupported>,
    /// What the drop-in leaves to the host without losing anything gpuctl could manage (device
    /// filter IDs of models gpuctl does not know) and profile names it translated (a model's
    /// earlier names): header comments, never a refusal.
    pub notes: Vec<Unsupported>,
}

/// A malformed mig-parted file: not YAML, not the documented shape, or no such config.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The text is not YAML.
    #[error("not YAML: {0}")]
    Yaml(#[from] serde_norway::Error),
    /// The YAML does not have mig-parted's shape; the string names the path.
    #[error("{0}")]
    Shape(String),
    /// The requested config is not in `mig-configs`.
    #[error("no config '{name}' in mig-configs (configs: {available})")]
    NoConfig {
        /// The config asked for.
        name: String,
        /// The configs in the file, comma-separated.
        available: String,
    },
}

/// The drop-in, as the `toml` crate serializes it.
#[derive(Debug, Serialize)]
struct DropIn {
    version: u32,
    gpu: Vec<GpuEntry>,
}

/// One `[[gpu]]` entry: one selector, one use. Field order matters: plain values before the
/// `mig` array of tables, as TOML requires.
#[derive(Debug, Serialize)]
struct GpuEntry {
    #[serde(skip_serializing_if = "Option::is_none")]
    all: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    index: Option<Vec<u32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    owner: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mig: Option<Vec<MigEntry>>,
}

#[derive(Debug, Clone, Serialize)]
struct MigEntry {
    profile: String,
    owner: String,
    #[serde(skip_serializing_if = "is_one")]
    count: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    compute: Option<Vec<String>>,
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

/// Which GPUs an entry selects.
enum Devices {
    All,
    Index(Vec<u32>),
}

/// Import config `config` of the mig-parted document `yaml`; `source` names the file in the
/// header comment, `owner` is the team for every share (placeholder when `None`).
pub fn import(
    yaml: &str,
    config: &str,
    owner: Option<&str>,
    source: &str,
) -> Result<Imported, ImportError> {
    let doc: Value = serde_norway::from_str(yaml)?;
    let top = doc.as_mapping().ok_or_else(|| {
        ImportError::Shape("top level: expected a mapping with mig-configs".into())
    })?;
    let mut unsupported = Vec::new();
    for (k, _) in top {
        match k.as_str() {
            Some("version") | Some("mig-configs") => {}
            other => unsupported.push(Unsupported {
                path: other.unwrap_or("?").to_string(),
                why: "not a mig-parted v1 key gpuctl knows".into(),
            }),
        }
    }
    match top.get("version").and_then(Value::as_str) {
        Some("v1") => {}
        Some(v) => {
            return Err(ImportError::Shape(format!(
                "version: '{v}' is not supported (gpuctl reads mig-parted version v1)"
            )))
        }
        None => return Err(ImportError::Shape("version: missing (expected v1)".into())),
    }
    let configs = top
        .get("mig-configs")
        .and_then(Value::as_mapping)
        .ok_or_else(|| ImportError::Shape("mig-configs: missing or not a mapping".into()))?;
    let entries = configs.get(config).ok_or_else(|| ImportError::NoConfig {
        name: config.to_string(),
        available: configs
            .keys()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(", "),
    })?;
    let base = format!("mig-configs.{config}");
    let entries = entries
        .as_sequence()
        .ok_or_else(|| ImportError::Shape(format!("{base}: expected a list of entries")))?;

    let owner_name = owner.unwrap_or(OWNER_PLACEHOLDER).to_string();
    let mut gpus = Vec::new();
    let mut notes = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let at = format!("{base}[{i}]");
        let map = entry
            .as_mapping()
            .ok_or_else(|| ImportError::Shape(format!("{at}: expected a mapping")))?;
        for (k, _) in map {
            match k.as_str() {
                Some("devices" | "mig-enabled" | "mig-devices" | "device-filter") => {}
                other => unsupported.push(Unsupported {
                    path: format!("{at}.{}", other.unwrap_or("?")),
                    why: "not a mig-parted config field gpuctl knows".into(),
                }),
            }
        }
        let devices = match map.get("devices") {
            Some(Value::String(s)) if s == "all" => Devices::All,
            Some(Value::Sequence(seq)) => Devices::Index(
                seq.iter()
                    .enumerate()
                    .map(|(j, v)| {
                        v.as_u64()
                            .and_then(|n| u32::try_from(n).ok())
                            .ok_or_else(|| {
                                ImportError::Shape(format!(
                                    "{at}.devices[{j}]: expected a GPU index, found {}",
                                    show(v)
                                ))
                            })
                    })
                    .collect::<Result<_, _>>()?,
            ),
            Some(v) => {
                return Err(ImportError::Shape(format!(
                    "{at}.devices: expected \"all\" or a list of GPU indices, found {}",
                    show(v)
                )))
            }
            None => return Err(ImportError::Shape(format!("{at}.devices: missing"))),
        };
        let enabled = match map.get("mig-enabled") {
            Some(Value::Bool(b)) => *b,
            Some(v) => {
                return Err(ImportError::Shape(format!(
                    "{at}.mig-enabled: expected true or false, found {}",
                    show(v)
                )))
            }
            None => return Err(ImportError::Shape(format!("{at}.mig-enabled: missing"))),
        };

        // Selectors: a device-filter narrows "all" to models; gpuctl has one selector per
        // entry, so a filter on an index list cannot be expressed.
        let mut selectors: Vec<GpuEntry> = Vec::new();
        let filter = match map.get("device-filter") {
            None => None,
            Some(Value::String(s)) => Some(vec![s.clone()]),
            Some(Value::Sequence(seq)) => Some(
                seq.iter()
                    .map(|v| {
                        v.as_str().map(str::to_string).ok_or_else(|| {
                            ImportError::Shape(format!(
                                "{at}.device-filter: expected PCI device IDs, found {}",
                                show(v)
                            ))
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            Some(v) => {
                return Err(ImportError::Shape(format!(
                    "{at}.device-filter: expected a PCI device ID or a list of them, found {}",
                    show(v)
                )))
            }
        };
        match (&devices, filter) {
            (Devices::All, None) => selectors.push(selector(Some(true), None, None)),
            (Devices::Index(i), None) => selectors.push(selector(None, Some(i.clone()), None)),
            (Devices::All, Some(ids)) => {
                let mut models: Vec<String> = Vec::new();
                for id in &ids {
                    match Catalog::get().by_pci_device_id(id) {
                        Some(m) if !models.contains(&m.key) => models.push(m.key.clone()),
                        Some(_) => {}
                        None => notes.push(Unsupported {
                            path: format!("{at}.device-filter"),
                            why: format!(
                                "PCI device ID {id} is no GPU model gpuctl knows \
                                 (data/gpu-profiles.json); a GPU of it is left as it is"
                            ),
                        }),
                    }
                }
                selectors.extend(models.into_iter().map(|m| selector(None, None, Some(m))));
            }
            (Devices::Index(_), Some(_)) => {
                unsupported.push(Unsupported {
                    path: format!("{at}.device-filter"),
                    why: "a device-filter on a devices list: a gpuctl [[gpu]] entry has one \
                          selector (index or model); this entry is left out"
                        .into(),
                });
            }
        }

        let mig = if enabled {
            let devs = match map.get("mig-devices") {
                Some(Value::Mapping(m)) => Some(m),
                None | Some(Value::Null) => None,
                Some(v) => {
                    return Err(ImportError::Shape(format!(
                        "{at}.mig-devices: expected a mapping of profile to count, found {}",
                        show(v)
                    )))
                }
            };
            let mut out = Vec::new();
            // No mig-devices at all, like an empty mapping, leaves `out` empty.
            for (k, v) in devs.into_iter().flatten() {
                let name = k.as_str().ok_or_else(|| {
                    ImportError::Shape(format!(
                        "{at}.mig-devices: profile {} is not a name",
                        show(k)
                    ))
                })?;
                let count = v
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| {
                        ImportError::Shape(format!(
                            "{at}.mig-devices.\"{name}\": expected a count, found {}",
                            show(v)
                        ))
                    })?;
                if count == 0 {
                    continue; // zero instances of a profile: nothing to create
                }
                let (mut profile, compute) = split_profile(name);
                if GpuModel::offering(&profile).is_empty() {
                    if let Some((m, now)) = GpuModel::renamed(&profile) {
                        notes.push(Unsupported {
                            path: format!("{at}.mig-devices.\"{name}\""),
                            why: format!(
                                "{profile} is an earlier name of {}'s {now} (the same slices; \
                                 drivers of its production boards report {now}); imported as {now}",
                                m.key
                            ),
                        });
                        profile = now.to_string();
                    }
                }
                out.push(MigEntry {
                    profile,
                    owner: owner_name.clone(),
                    count,
                    compute: compute.map(|c| vec![c]),
                });
            }
            // No devices (`all-enabled`) is `mig = []`: MIG on, no instances, no owner.
            // A filter of unknown models only selects nothing: its notes say so.
            let missing = if selectors.is_empty() {
                vec![]
            } else {
                missing_profiles(&out, &selectors, &at)
            };
            if !missing.is_empty() {
                unsupported.extend(missing);
                continue;
            }
            Some(out)
        } else {
            if map.get("mig-devices").is_some_and(|v| {
                v.as_mapping().is_some_and(|m| !m.is_empty()) || v.as_sequence().is_some()
            }) {
                unsupported.push(Unsupported {
                    path: format!("{at}.mig-devices"),
                    why: "MIG devices with mig-enabled: false (mig-parted ignores them too)".into(),
                });
            }
            None
        };
        gpus.extend(selectors.into_iter().map(|s| GpuEntry {
            owner: mig.is_none().then(|| owner_name.clone()),
            mig: mig.clone(),
            ..s
        }));
    }

    let body = toml::to_string(&DropIn {
        version: 1,
        gpu: gpus,
    })
    .map_err(|e| ImportError::Shape(format!("cannot write the drop-in: {e}")))?;
    let mut header = format!(
        "# Imported from mig-parted config '{config}' of {source} by `gpuctl import mig-parted`.\n"
    );
    if owner.is_none() && body.contains(OWNER_PLACEHOLDER) {
        header.push_str(&format!(
            "# mig-parted has no owners: replace every \"{OWNER_PLACEHOLDER}\" with a team from \
             [teams.*]\n# (the file does not validate until you do).\n"
        ));
    }
    header.push_str(
        "# Check it in place before installing: gpuctl validate --as /etc/gpuctl/policy.d/NAME.toml FILE\n",
    );
    for u in &unsupported {
        header.push_str(&format!("# NOT IMPORTED: {u}\n"));
    }
    for n in &notes {
        header.push_str(&format!("# Note: {}: {}\n", n.path, n.why));
    }
    Ok(Imported {
        toml: format!("{header}\n{body}"),
        unsupported,
        notes,
    })
}

/// The profiles of `mig` that the entry's GPUs cannot have: under model selectors, each
/// model's missing ones; otherwise those no model gpuctl knows offers (an `all`/index entry
/// with a profile only some models have imports, and `validate` names those models).
fn missing_profiles(mig: &[MigEntry], selectors: &[GpuEntry], at: &str) -> Vec<Unsupported> {
    let catalog = Catalog::get();
    let mut out = Vec::new();
    for e in mig {
        let offering = GpuModel::offering(&e.profile);
        let having = || {
            if offering.is_empty() {
                "no model gpuctl knows has it".to_string()
            } else {
                let keys: Vec<&str> = offering.iter().map(|m| m.key.as_str()).collect();
                format!("models that have it: {}", keys.join(", "))
            }
        };
        let path = format!("{at}.mig-devices.\"{}\"", e.profile);
        let models: Vec<&str> = selectors
            .iter()
            .filter_map(|s| s.model.as_deref())
            .collect();
        if models.is_empty() {
            if offering.is_empty() {
                out.push(Unsupported {
                    path,
                    why: format!(
                        "profile {} is in no GPU model of data/gpu-profiles.json; \
                         this entry is left out",
                        e.profile
                    ),
                });
            }
            continue;
        }
        for m in models {
            if catalog
                .by_key(m)
                .is_some_and(|m| m.gi_profile(&e.profile).is_none())
            {
                out.push(Unsupported {
                    path: path.clone(),
                    why: format!(
                        "{m} has no profile {} ({}); this entry is left out",
                        e.profile,
                        having()
                    ),
                });
            }
        }
    }
    out
}

fn selector(all: Option<bool>, index: Option<Vec<u32>>, model: Option<String>) -> GpuEntry {
    GpuEntry {
        all,
        index,
        model,
        owner: None,
        mig: None,
    }
}

/// `"1c.3g.40gb"` → (`3g.40gb`, `Some("1c")`); `"3g.40gb"`, `"1g.10gb+me"` → unchanged, `None`.
fn split_profile(name: &str) -> (String, Option<String>) {
    if let Some((first, rest)) = name.split_once('.') {
        let is_ci = first.len() >= 2
            && first.ends_with('c')
            && first[..first.len() - 1].bytes().all(|b| b.is_ascii_digit());
        if is_ci && rest.contains('g') {
            return (rest.to_string(), Some(first.to_string()));
        }
    }
    (name.to_string(), None)
}

/// A short rendering of a YAML value for messages.
fn show(v: &Value) -> String {
    serde_norway::to_string(v)
        .map(|s| s.trim().replace('\n', " "))
        .unwrap_or_else(|_| "?".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::parse::parse_fragment;
    use crate::policy::validate::build;
    use crate::policy::Severity;
    use std::path::Path;

    /// Written from mig-parted's documented format (README "Configuration" and the example
    /// `examples/config.yaml`): the A100-40GB `all-*` configs and the README's `custom-config`.
    const EXAMPLE: &str = r#"
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false

  all-enabled:
    - devices: all
      mig-enabled: true
      mig-devices: {}

  all-1g.5gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.5gb": 7

  all-2g.10gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "2g.10gb": 3

  all-3g.20gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "3g.20gb": 2

  all-balanced:
    - device-filter: ["0x20B010DE", "0x20B110DE", "0x20F110DE", "0x20F610DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.5gb": 2
        "2g.10gb": 1
        "3g.20gb": 1

    - device-filter: "0x233010DE"
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 2
        "2g.20gb": 1
        "3g.40gb": 1

  custom-config:
    - devices: [0,1,2,3]
      mig-enabled: false
    - devices: [4]
      mig-enabled: true
      mig-devices:
        "1g.5gb": 7
    - devices: [5]
      mig-enabled: true
      mig-devices:
        "2g.10gb": 3
    - devices: [6]
      mig-enabled: true
      mig-devices:
        "3g.20gb": 2
    - devices: [7]
      mig-enabled: true
      mig-devices:
        "1g.5gb": 2
        "2g.10gb": 1
        "3g.20gb": 1

  compute-split:
    - devices: [0]
      mig-enabled: true
      mig-devices:
        "1c.3g.20gb": 1
        "2c.3g.20gb": 1
"#;

    /// The drop-in plus a team fragment, through gpuctl's own parser and validator.
    fn validate(toml: &str, team: &str) -> Vec<String> {
        let mut diags = Vec::new();
        let teams = format!("version = 1\n[teams.{team}]\nmembers = [\"alice\"]\n");
        let a = parse_fragment(Path::new("teams.toml"), &teams, &mut diags).unwrap();
        let b = parse_fragment(Path::new("import.toml"), toml, &mut diags).expect("parses");
        build(&[a, b], &mut diags);
        diags
            .iter()
            .filter(|d| d.severity == Severity::Error)
            .map(|d| d.to_string())
            .collect()
    }

    /// `toml` validates with team `infer`.
    fn assert_valid(toml: &str) {
        assert_eq!(validate(toml, "infer"), Vec::<String>::new(), "{toml}");
    }

    #[test]
    fn published_all_configs_import_and_validate() {
        for config in [
            "all-disabled",
            "all-enabled",
            "all-1g.5gb",
            "all-2g.10gb",
            "all-3g.20gb",
        ] {
            let i = import(EXAMPLE, config, Some("infer"), "config.yaml").unwrap();
            assert!(i.unsupported.is_empty(), "{config}: {:?}", i.unsupported);
            assert_eq!(
                validate(&i.toml, "infer"),
                Vec::<String>::new(),
                "{config}:\n{}",
                i.toml
            );
        }
        let i = import(EXAMPLE, "all-1g.5gb", Some("infer"), "config.yaml").unwrap();
        assert!(i.toml.contains(
            "[[gpu]]\nall = true\n\n[[gpu.mig]]\nprofile = \"1g.5gb\"\nowner = \"infer\"\ncount = 7\n"
        ), "{}", i.toml);
        let i = import(EXAMPLE, "all-disabled", Some("infer"), "config.yaml").unwrap();
        assert!(
            i.toml.contains("[[gpu]]\nall = true\nowner = \"infer\"\n"),
            "{}",
            i.toml
        );
    }

    #[test]
    fn custom_config_maps_indices_and_mixes() {
        let i = import(EXAMPLE, "custom-config", Some("infer"), "config.yaml").unwrap();
        assert!(i.unsupported.is_empty());
        assert_valid(&i.toml);
        let v: toml::Value = toml::from_str(&i.toml).unwrap();
        let gpus = v["gpu"].as_array().unwrap();
        assert_eq!(gpus.len(), 5);
        assert_eq!(gpus[0]["index"].as_array().unwrap().len(), 4);
        assert_eq!(gpus[0]["owner"].as_str(), Some("infer"));
        assert_eq!(gpus[4]["index"][0].as_integer(), Some(7));
        let mig = gpus[4]["mig"].as_array().unwrap();
        let got: Vec<_> = mig
            .iter()
            .map(|m| {
                (
                    m["profile"].as_str().unwrap(),
                    m.get("count")
                        .and_then(toml::Value::as_integer)
                        .unwrap_or(1),
                )
            })
            .collect();
        assert_eq!(got, vec![("1g.5gb", 2), ("2g.10gb", 1), ("3g.20gb", 1)]);
    }

    #[test]
    fn device_filter_becomes_model_selectors() {
        let i = import(EXAMPLE, "all-balanced", Some("infer"), "config.yaml").unwrap();
        // Every ID is a known model: the four A100/A800 40GB IDs are three entries.
        assert!(i.unsupported.is_empty(), "{:?}", i.unsupported);
        assert!(i.notes.is_empty(), "{:?}", i.notes);
        let v: toml::Value = toml::from_str(&i.toml).unwrap();
        let models: Vec<_> = v["gpu"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["model"].as_str().unwrap())
            .collect();
        assert_eq!(
            models,
            vec![
                "A100-SXM4-40GB",
                "A100-PCIE-40GB",
                "A800-PCIe-40GB",
                "H100-SXM5-80GB"
            ]
        );
        assert_valid(&i.toml);
        // An ID of a model gpuctl does not know is a note in the header, not a refusal.
        let yaml = EXAMPLE.replace("\"0x20F610DE\"", "\"0x233D10DE\"");
        let i = import(&yaml, "all-balanced", Some("infer"), "config.yaml").unwrap();
        assert!(i.unsupported.is_empty(), "{:?}", i.unsupported);
        assert_eq!(i.notes.len(), 1);
        assert_eq!(i.notes[0].path, "mig-configs.all-balanced[0].device-filter");
        assert!(i.notes[0]
            .why
            .starts_with("PCI device ID 0x233D10DE is no GPU model"));
        assert!(i.toml.contains("# Note: mig-configs.all-balanced[0]"));
        // A filtered model that lacks a profile is named with the models that have it.
        let yaml = EXAMPLE.replace("\"3g.40gb\": 1", "\"3g.20gb\": 1");
        let i = import(&yaml, "all-balanced", Some("infer"), "config.yaml").unwrap();
        let why: Vec<_> = i.unsupported.iter().map(|u| u.to_string()).collect();
        assert_eq!(why.len(), 1, "{why:?}");
        assert!(why[0].starts_with(
            "mig-configs.all-balanced[1].mig-devices.\"3g.20gb\": unsupported: \
             H100-SXM5-80GB has no profile 3g.20gb (models that have it: "
        ));
        assert!(why[0].contains("A800-PCIe-40GB"), "{why:?}");
    }

    #[test]
    fn mig_on_without_devices_imports_as_an_empty_geometry() {
        // `all-enabled`: MIG mode only. No owner is written (mig = [] gives no team anything),
        // so the drop-in validates as it is, even without --owner.
        for owner in [Some("infer"), None] {
            let i = import(EXAMPLE, "all-enabled", owner, "c.yaml").unwrap();
            assert!(i.unsupported.is_empty(), "{:?}", i.unsupported);
            assert!(
                i.toml.contains("[[gpu]]\nall = true\nmig = []\n"),
                "{}",
                i.toml
            );
            assert!(!i.toml.contains(OWNER_PLACEHOLDER), "{}", i.toml);
            assert_valid(&i.toml);
            let v: toml::Value = toml::from_str(&i.toml).unwrap();
            assert_eq!(v["gpu"][0]["mig"].as_array().map(Vec::len), Some(0));
            assert!(v["gpu"][0].get("owner").is_none());
        }
        // Absent `mig-devices` and only zero counts say the same.
        let yaml =
            "version: v1\nmig-configs:\n  c:\n    - devices: [1]\n      mig-enabled: true\n    \
                    - devices: [2]\n      mig-enabled: true\n      mig-devices: {\"1g.10gb\": 0}\n";
        let i = import(yaml, "c", None, "c.yaml").unwrap();
        assert!(i.unsupported.is_empty(), "{:?}", i.unsupported);
        assert!(
            i.toml
                .contains("[[gpu]]\nindex = [1]\nmig = []\n\n[[gpu]]\nindex = [2]\nmig = []\n"),
            "{}",
            i.toml
        );
        assert_valid(&i.toml);
    }

    #[test]
    fn unsupported_fields_are_named() {
        let yaml = "version: v1\nextra: 1\nmig-configs:\n  c:\n    - devices: [0]\n      \
                    mig-enabled: false\n      mig-devices: {\"1g.5gb\": 1}\n      \
                    future-field: x\n    - devices: [1]\n      device-filter: \"0x233010DE\"\n      \
                    mig-enabled: false\n";
        let i = import(yaml, "c", None, "c.yaml").unwrap();
        let got: Vec<_> = i.unsupported.iter().map(|u| u.path.as_str()).collect();
        assert_eq!(
            got,
            [
                "extra",
                "mig-configs.c[0].future-field",
                "mig-configs.c[0].mig-devices",
                "mig-configs.c[1].device-filter",
            ]
        );
        // Without --owner, the placeholder keeps the drop-in from validating.
        assert!(i.toml.contains(&format!("owner = \"{OWNER_PLACEHOLDER}\"")));
        assert!(!validate(&i.toml, "infer").is_empty());
    }

    #[test]
    fn compute_instance_names_split_into_gi_and_ci() {
        assert_eq!(
            split_profile("1c.3g.20gb"),
            ("3g.20gb".into(), Some("1c".into()))
        );
        assert_eq!(split_profile("1g.5gb+me"), ("1g.5gb+me".into(), None));
        assert_eq!(split_profile("7g.80gb"), ("7g.80gb".into(), None));
        let i = import(EXAMPLE, "compute-split", Some("infer"), "c.yaml").unwrap();
        assert!(i.toml.contains("profile = \"3g.20gb\"\nowner = \"infer\"\ncompute = [\"1c\"]\n\n[[gpu.mig]]\nprofile = \"3g.20gb\"\nowner = \"infer\"\ncompute = [\"2c\"]"), "{}", i.toml);
        assert_valid(&i.toml);
    }

    #[test]
    fn malformed_input_is_an_error_naming_the_path() {
        let err = |yaml: &str, config: &str| {
            import(yaml, config, None, "c.yaml")
                .unwrap_err()
                .to_string()
        };
        let e = err(EXAMPLE, "nope");
        assert!(
            e.starts_with("no config 'nope' in mig-configs (configs: all-disabled, all-enabled"),
            "{e}"
        );
        let e = err(
            "version: v1\nmig-configs:\n  c:\n    - devices: [0, x]\n      mig-enabled: true\n",
            "c",
        );
        assert_eq!(
            e,
            "mig-configs.c[0].devices[1]: expected a GPU index, found x"
        );
        let e = err("version: v2\nmig-configs: {}\n", "c");
        assert!(e.contains("v2"), "{e}");
        assert!(matches!(
            import(": : [", "c", None, "c.yaml"),
            Err(ImportError::Yaml(_))
        ));
    }
}
