//! `gpuctl metrics`: gpuctld's Prometheus metrics (its `Metrics` bus call) on stdout, or
//! written atomically for node_exporter's textfile collector (`--textfile`).

use super::shell::with_agent;
use clap::Args;
use std::path::PathBuf;

/// Arguments of `gpuctl metrics`.
#[derive(Debug, Args)]
#[command(
    after_long_help = "With --textfile the Prometheus text format is written to a \
temporary file beside PATH and renamed over it, so node_exporter never reads half a file \
(`gpuctl-textfile.timer` does this every 30 s). See docs/monitoring.md for every metric.

Exit status: 0; 6 gpuctld not running; 2 other failure."
)]
pub struct MetricsArgs {
    /// `openmetrics` (what Prometheus scrapes) or `prometheus-text` (node_exporter's format).
    #[arg(long, default_value = "openmetrics", value_parser = ["openmetrics", "prometheus-text"])]
    pub format: String,
    /// Write to PATH (e.g. /var/lib/prometheus/node-exporter/gpuctl.prom) in
    /// `prometheus-text` format instead of printing.
    #[arg(long, value_name = "PATH")]
    pub textfile: Option<PathBuf>,
}

/// Write `text` to `path` through a temporary file in the same directory and a rename.
pub fn write_textfile(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other(format!("{}: not a file path", path.display())))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Run `gpuctl metrics`.
pub fn run(args: &MetricsArgs) -> i32 {
    let format = if args.textfile.is_some() {
        "prometheus-text"
    } else {
        args.format.as_str()
    };
    let text = match with_agent("Metrics", async |p| p.metrics(format).await) {
        Ok(t) => t,
        Err(f) => return f.report(),
    };
    match &args.textfile {
        None => {
            print!("{text}");
            super::exit::OK
        }
        Some(p) => match write_textfile(p, &text) {
            Ok(()) => super::exit::OK,
            Err(e) => {
                eprintln!("gpuctl: {}: {e}", p.display());
                super::exit::UNREADABLE
            }
        },
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn textfile_is_replaced_whole() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("gpuctl.prom");
        super::write_textfile(&p, "a 1\n").unwrap();
        super::write_textfile(&p, "a 2\n").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "a 2\n");
        assert_eq!(
            std::fs::read_dir(t.path()).unwrap().count(),
            1,
            "no temp file left"
        );
        assert!(super::write_textfile(&t.path().join("no/such/dir/x.prom"), "a 1\n").is_err());
    }
}
