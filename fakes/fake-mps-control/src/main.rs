//! `nvidia-cuda-mps-control` test double. `-f`: run the control daemon in the foreground;
//! no argument: read commands from stdin and forward them to the running daemon.
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(fake_mps_control::main_with(&args));
}
