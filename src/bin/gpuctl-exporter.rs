//! `gpuctl-exporter`: serves gpuctld's Prometheus metrics over HTTP, unprivileged and
//! socket-activated (see the library's `exporter` module).
use anyhow::Context;
use clap::Parser;
use gpuctl::dbus_api::client::Agent1Proxy;
use std::rc::Rc;

/// Serve gpuctld's metrics at /metrics (socket-activated by gpuctl-exporter.socket).
#[derive(Debug, Parser)]
#[command(name = "gpuctl-exporter", version)]
struct Args {
    /// Listen here when not started by systemd's socket activation.
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:9849")]
    listen: String,
    /// Seconds a client has to send its request.
    #[arg(long, value_name = "SECS", default_value_t = 3)]
    read_timeout: u64,
    /// Connections served at once; when all are taken, the oldest one still silent is dropped
    /// for a new one, else the new one gets 503.
    #[arg(long, value_name = "N", default_value_t = 64)]
    max_connections: usize,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let std_listener = match gpuctl::exporter::socket_from_systemd() {
            Some(l) => l,
            None => std::net::TcpListener::bind(&args.listen)
                .with_context(|| format!("listen on {}", args.listen))?,
        };
        std_listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(std_listener)?;
        let conn = zbus::Connection::system().await.context("system bus")?;
        let proxy = Rc::new(Agent1Proxy::new(&conn).await.context("gpuctld proxy")?);
        let opts = gpuctl::exporter::Options {
            read_timeout: std::time::Duration::from_secs(args.read_timeout.max(1)),
            max_connections: args.max_connections.max(1),
            ..Default::default()
        };
        gpuctl::exporter::serve(listener, opts, move || {
            let p = proxy.clone();
            async move { p.metrics("openmetrics").await }
        })
        .await
        .context("accept")?;
        Ok(())
    })
}
