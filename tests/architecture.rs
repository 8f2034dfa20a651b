//! The import rules of `docs/architecture.md`, checked on the source: no two top-level modules
//! import each other (directly or round a loop), nor two submodules of one module (`super::X`,
//! `crate::module::X`), `daemon` is imported by nobody, and `cli` by nothing below it. The same check as the shell line in the doc, so that a new feature that
//! closes a loop fails CI instead of the doc going stale (it did: `usage` ↔ `dbus_api` and
//! `observe` ↔ `policy` had crept in).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Top-level module → the top-level modules it names as `crate::X` outside comment lines.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        if first == "bin" || first == "lib.rs" {
            continue;
        }
        let module = first.trim_end_matches(".rs").to_string();
        let text = std::fs::read_to_string(&f).unwrap();
        let deps = graph.entry(module.clone()).or_default();
        for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for (i, _) in line.match_indices("crate::") {
                let name: String = line[i + 7..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if !name.is_empty() && name != module {
                    deps.insert(name);
                }
            }
        }
    }
    graph
}

/// A loop in the graph, as the modules along it, if there is one.
fn find_loop(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        g: &BTreeMap<String, BTreeSet<String>>,
        m: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == m) {
            let mut l = path[at..].to_vec();
            l.push(m.to_string());
            return Some(l);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for d in g.get(m).into_iter().flatten() {
            if let Some(l) = visit(g, d, path, done) {
                return Some(l);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|m| visit(graph, m, &mut Vec::new(), &mut done))
}

#[test]
fn the_finder_sees_a_loop_and_a_clean_graph() {
    let g = |edges: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
        }
        g
    };
    assert_eq!(find_loop(&g(&[("a", "b"), ("b", "c"), ("a", "c")])), None);
    assert_eq!(
        find_loop(&g(&[("a", "b"), ("b", "c"), ("c", "a")])),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
}

#[test]
fn imports_go_one_way() {
    let graph = imports();
    assert!(graph.len() > 20, "modules found: {:?}", graph.keys());
    assert_eq!(find_loop(&graph), None, "an import loop between modules");
    for (m, deps) in &graph {
        assert!(!deps.contains("daemon"), "{m} imports daemon");
        if [
            "policy", "plan", "apply", "observe", "settings", "real", "systemd",
        ]
        .contains(&m.as_str())
        {
            assert!(!deps.contains("cli"), "{m} imports cli");
        }
    }
}

/// The sibling names `text` (a file `levels` below `module`'s directory: 1 for `module/x.rs`
/// and `module/x/mod.rs`, 2 for `module/x/y.rs`) refers to as `super::NAME` (as many `super`s
/// as `levels`) or `crate::module::NAME`, brace lists included, outside comment lines.
fn sibling_refs(text: &str, module: &str, levels: usize) -> BTreeSet<String> {
    let code: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect()
    };
    // The first name of `rest` or of each entry of the brace list it starts with.
    let names = |rest: &str, out: &mut BTreeSet<String>| {
        let Some(list) = rest.strip_prefix('{') else {
            out.insert(ident(rest));
            return;
        };
        let (mut depth, mut start) = (0, 0);
        for (i, c) in list.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    out.insert(ident(&list[start..i]));
                    return;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    out.insert(ident(&list[start..i]));
                    start = i + 1;
                }
                _ => {}
            }
        }
    };
    let mut out = BTreeSet::new();
    let up = "super::".repeat(levels);
    for (i, _) in code.match_indices(&up) {
        // Exactly `levels` of them: not the tail of a longer run, nor the head of one.
        let before = &code[..i];
        let rest = &code[i + up.len()..];
        if !before.ends_with("super::") && !rest.starts_with("super::") {
            names(rest, &mut out);
        }
    }
    let down = format!("crate::{module}::");
    for (i, _) in code.match_indices(&down) {
        names(&code[i + down.len()..], &mut out);
    }
    out.retain(|n| !n.is_empty());
    out
}

/// Per top-level module with a directory: submodule → the sibling submodules it names outside
/// its tests (a file's `#[cfg(test)]` part, `tests.rs`). The module's own `mod.rs` is its glue
/// (it declares them all) and is left out.
fn submodule_imports() -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(&src).unwrap().flatten() {
        let dir = e.path();
        let module = e.file_name().to_string_lossy().into_owned();
        if !dir.is_dir() || module == "bin" {
            continue;
        }
        let siblings: BTreeSet<String> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.trim_end_matches(".rs").to_string()
            })
            .filter(|n| n != "mod")
            .collect();
        let mut files = Vec::new();
        rust_files(&dir, &mut files);
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for f in files {
            let rel: Vec<String> = f
                .strip_prefix(&dir)
                .unwrap()
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            // Test code may use any sibling (a test builds what it checks from them).
            if rel == ["mod.rs"] || rel.iter().any(|c| c == "tests.rs" || c == "tests") {
                continue;
            }
            let sub = rel[0].trim_end_matches(".rs").to_string();
            let levels = rel.len() - usize::from(rel.last().unwrap() == "mod.rs");
            let text = std::fs::read_to_string(&f).unwrap();
            let text = text.split("#[cfg(test)]").next().unwrap();
            let deps = graph.entry(sub.clone()).or_default();
            for n in sibling_refs(text, &module, levels) {
                if n != sub && siblings.contains(&n) {
                    deps.insert(n);
                }
            }
        }
        out.insert(module, graph);
    }
    out
}

#[test]
fn the_submodule_reader_sees_super_crate_and_brace_lists() {
    let text = "use super::{mps, props::{a, b}, Systemd};\n\
                // super::commented\n\
                let p = super::scope::f(x);\n\
                use super::super::deeper;\n\
                crate::systemd::client::bus();\n\
                crate::systemd_other::x();";
    let got = sibling_refs(text, "systemd", 1);
    let want: BTreeSet<String> = ["mps", "props", "scope", "client"]
        .into_iter()
        .map(String::from)
        .collect();
    // `Systemd` is an item of the parent (not lower case), `deeper` is two levels up.
    assert_eq!(got, want);
    assert_eq!(
        sibling_refs("use super::super::{join, usage};", "dbus_api", 2),
        ["join", "usage"].into_iter().map(String::from).collect()
    );
}

#[test]
fn submodules_of_one_module_import_one_way() {
    let all = submodule_imports();
    let systemd = &all["systemd"];
    assert!(
        systemd.contains_key("scope") && systemd["scope"].contains("client"),
        "the reader missed scope's import of client: {systemd:?}"
    );
    let loops: Vec<String> = all
        .iter()
        .filter_map(|(m, g)| find_loop(g).map(|l| format!("{m}: {}", l.join(" -> "))))
        .collect();
    assert!(
        loops.is_empty(),
        "import loops between submodules:\n{}",
        loops.join("\n")
    );
}
