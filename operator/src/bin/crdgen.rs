//! Writes the CRD YAML files into `crds/` (or the directory given as the first argument).

#![forbid(unsafe_code)]

use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let dir = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../crds"));
    std::fs::create_dir_all(&dir)?;
    for (file, yaml) in quiver_operator::crdgen::generated() {
        let path = dir.join(file);
        std::fs::write(&path, yaml)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
