//! The library's layering, held by a test (#45): docs/design.md's layer table ("Layers")
//! names every module of `src/` once, and each module imports (`crate::…`) only modules of
//! its own layer or below, with no import cycle among them. A module is a top-level module
//! of `src/`, except in a table format's folder (`delta/`), whose parts are modules of their
//! own (`delta::scan`; `delta` is the folder's `mod.rs`). Test code (`#[cfg(test)] mod
//! tests` blocks, `tests.rs`, `testing.rs`) is left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Folders whose parts are modules of their own.
const FOLDERS: &[&str] = &["delta"];

/// The module a file (relative to `src/`) belongs to.
fn module_of(rel: &Path) -> String {
    let parts: Vec<String> = rel
        .components()
        .map(|c| {
            c.as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_string()
        })
        .collect();
    match parts.as_slice() {
        [folder, part, ..] if FOLDERS.contains(&folder.as_str()) && part != "mod" => {
            format!("{folder}::{part}")
        }
        [first, ..] => first.clone(),
        [] => String::new(),
    }
}

/// Module → the modules its non-test code names (`crate::x`, `crate::delta::y`).
fn imports(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let uses = regex::Regex::new(r"\bcrate::([a-z_][a-z0-9_]*)(?:::([a-z_][a-z0-9_]*))?").unwrap();
    let comment = regex::Regex::new(r"//.*").unwrap();
    let parts: BTreeMap<&str, BTreeSet<String>> = FOLDERS
        .iter()
        .map(|f| {
            let names = std::fs::read_dir(src.join(f))
                .unwrap()
                .map(|e| module_of(Path::new(f).join(e.unwrap().file_name()).as_path()))
                .collect();
            (*f, names)
        })
        .collect();
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if !name.ends_with(".rs") || name == "tests.rs" || name == "testing.rs" {
                continue;
            }
            let module = module_of(path.strip_prefix(src).unwrap());
            if ["lib", "layers"].contains(&module.as_str()) {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
            let code = comment.replace_all(code, "");
            let deps = out.entry(module.clone()).or_default();
            for c in uses.captures_iter(&code) {
                let dep = match (parts.get(&c[1]), c.get(2)) {
                    (Some(names), Some(part)) => {
                        let m = format!("{}::{}", &c[1], part.as_str());
                        if names.contains(&m) {
                            m
                        } else {
                            c[1].to_string()
                        }
                    }
                    _ => c[1].to_string(),
                };
                if dep != module {
                    deps.insert(dep);
                }
            }
        }
    }
    out
}

/// docs/design.md's layer table: module → its layer (0 at the bottom). A module is a name in
/// backticks in the table's second column, outside parentheses (those name its files).
fn layers(design: &str) -> BTreeMap<String, usize> {
    let table = design
        .split("### Layers")
        .nth(1)
        .expect("docs/design.md has a \"### Layers\" section");
    let names = regex::Regex::new(r"`([a-z_][a-z0-9_]*(?:::[a-z_][a-z0-9_]*)?)`").unwrap();
    let parens = regex::Regex::new(r"\([^)]*\)").unwrap();
    let mut out = BTreeMap::new();
    let rows = table
        .lines()
        .skip_while(|l| !l.starts_with("| layer"))
        .skip(2)
        .take_while(|l| l.starts_with('|'));
    for (layer, row) in rows.enumerate() {
        let column = row.split('|').nth(2).unwrap_or("");
        if column.contains("not in the library") {
            continue;
        }
        for c in names.captures_iter(&parens.replace_all(column, "")) {
            assert!(
                out.insert(c[1].to_string(), layer).is_none(),
                "`{}` is in two layers of the table",
                &c[1]
            );
        }
    }
    out
}

/// Module cycles: the strongly connected components of more than one module.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Kosaraju's: order by finish time, then walk the reversed graph.
    fn visit<'a>(
        v: &'a str,
        g: &'a BTreeMap<String, BTreeSet<String>>,
        seen: &mut BTreeSet<&'a str>,
        out: &mut Vec<&'a str>,
    ) {
        if !seen.insert(v) {
            return;
        }
        for w in g.get(v).into_iter().flatten() {
            visit(w, g, seen, out);
        }
        out.push(v);
    }
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    for v in graph.keys() {
        visit(v, graph, &mut seen, &mut order);
    }
    let mut reversed: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (v, ws) in graph {
        for w in ws {
            reversed.entry(w.clone()).or_default().insert(v.clone());
        }
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for v in order.into_iter().rev() {
        let mut component = Vec::new();
        visit(v, &reversed, &mut seen, &mut component);
        if component.len() > 1 {
            let mut c: Vec<String> = component.into_iter().map(str::to_string).collect();
            c.sort();
            out.push(c);
        }
    }
    out
}

#[test]
fn every_module_imports_only_its_layer_and_below_without_cycles() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let graph = imports(&root.join("src"));
    let design = std::fs::read_to_string(root.join("../docs/design.md")).unwrap();
    let layer = layers(&design);
    let mut problems = Vec::new();
    for m in graph.keys().filter(|m| !layer.contains_key(*m)) {
        problems.push(format!("`{m}` is in no layer of docs/design.md's table"));
    }
    for m in layer.keys().filter(|m| !graph.contains_key(*m)) {
        problems.push(format!(
            "`{m}` is in docs/design.md's table but not in src/"
        ));
    }
    for (m, deps) in &graph {
        for d in deps.iter().filter(|d| graph.contains_key(*d)) {
            if let (Some(lm), Some(ld)) = (layer.get(m), layer.get(d)) {
                if ld > lm {
                    problems.push(format!(
                        "`{m}` (layer {lm}) imports `{d}` (layer {ld}, above)"
                    ));
                }
            }
        }
    }
    let graph: BTreeMap<String, BTreeSet<String>> = graph
        .iter()
        .map(|(m, ds)| {
            let ds = ds.iter().filter(|d| graph.contains_key(*d)).cloned();
            (m.clone(), ds.collect())
        })
        .collect();
    for c in cycles(&graph) {
        problems.push(format!("import cycle among {c:?}"));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_cycle_and_an_upward_import_are_found() {
    let g = |edges: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
            g.entry(b.to_string()).or_default();
        }
        g
    };
    assert_eq!(
        cycles(&g(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")])),
        vec![vec!["a".to_string(), "b".into(), "c".into()]]
    );
    assert!(cycles(&g(&[("a", "b"), ("b", "c")])).is_empty());
    let table = "### Layers\n\n| layer | modules | what |\n|---|---|---|\n| low | `error` | x |\n| high | `engine` (`tests`) | y |\n";
    let l = layers(table);
    assert_eq!((l["error"], l["engine"]), (0, 1));
    assert!(!l.contains_key("tests"));
}
