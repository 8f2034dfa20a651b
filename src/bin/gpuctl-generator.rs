//! `gpuctl-generator`: systemd generator writing team slices from the last applied state.
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(gpuctl::daemon::generator::main_with(
        &args,
        &gpuctl::paths::Root::default(),
    ));
}
