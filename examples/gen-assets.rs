//! Writes the generated packaging assets for `gpuctl` into a directory: the `gpuctl(1)` man page
//! (plus one `gpuctl-<subcommand>(1)` page each) and bash, zsh and fish completions, all rendered
//! from the clap command so they never drift from `--help`.
//!
//! Usage: `cargo run --example gen-assets -- OUTDIR`. `packaging/build.sh` calls it.

use anyhow::{Context, Result};
use clap_complete::Shell;
use std::fs;
use std::path::PathBuf;

fn main() -> Result<()> {
    let out: PathBuf = std::env::args_os()
        .nth(1)
        .context("usage: gen-assets OUTDIR")?
        .into();
    let man_dir = out.join("man");
    let comp_dir = out.join("completions");
    fs::create_dir_all(&man_dir).with_context(|| format!("creating {}", man_dir.display()))?;
    fs::create_dir_all(&comp_dir).with_context(|| format!("creating {}", comp_dir.display()))?;

    // One page for gpuctl and one gpuctl-<subcommand>(1) page per subcommand, cross-referenced.
    clap_mangen::generate_to(gpuctl::cli::command(), &man_dir)
        .with_context(|| format!("writing man pages into {}", man_dir.display()))?;

    for (shell, file) in [
        (Shell::Bash, "gpuctl"),
        (Shell::Zsh, "_gpuctl"),
        (Shell::Fish, "gpuctl.fish"),
    ] {
        let path = comp_dir.join(file);
        let mut buf = Vec::new();
        clap_complete::generate(shell, &mut gpuctl::cli::command(), "gpuctl", &mut buf);
        fs::write(&path, buf).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
