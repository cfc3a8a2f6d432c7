//! `cargo xtask header [--check]`: generates the AICPU program's C header
//! `aicpu/include/wsp_aicpu.h` from the `aicpu` crate with cbindgen (the
//! configuration is `aicpu/cbindgen.toml`), or with `check` fails when the
//! checked-in header is stale.

use std::path::Path;

use anyhow::{bail, Context, Result};

/// The checked-in header, from the workspace root.
pub const HEADER: &str = "aicpu/include/wsp_aicpu.h";
const CRATE: &str = "aicpu";

/// Writes the header; with `check`, only compares it with the checked-in
/// file and fails if they differ.
pub fn header(root: &Path, check: bool) -> Result<()> {
    let generated = generate(root)?;
    let path = root.join(HEADER);
    if check {
        let current = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        if current != generated {
            bail!("{HEADER} is stale: run cargo xtask header");
        }
        return Ok(());
    }
    std::fs::write(&path, generated).with_context(|| format!("writing {}", path.display()))
}

/// The header's text as cbindgen generates it now.
pub fn generate(root: &Path) -> Result<String> {
    let dir = root.join(CRATE);
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml"))
        .map_err(|e| anyhow::anyhow!("{CRATE}/cbindgen.toml: {e}"))?;
    let bindings = cbindgen::Builder::new()
        .with_crate(&dir)
        .with_config(config)
        .generate()
        .map_err(|e| anyhow::anyhow!("cbindgen on {CRATE}: {e}"))?;
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).context("cbindgen wrote non-UTF-8")
}
