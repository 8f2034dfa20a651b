# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_gpuctl_global_optspecs
    string join \n root= h/help V/version
end

function __fish_gpuctl_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_gpuctl_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_gpuctl_using_subcommand
    set -l cmd (__fish_gpuctl_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c gpuctl -n "__fish_gpuctl_needs_command" -l root -d 'Resolve every host path (policy directories, /run, /var/lib, /dev, /proc) under DIR' -r -F
complete -c gpuctl -n "__fish_gpuctl_needs_command" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -s V -l version -d 'Print version'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "validate" -d 'Check policy files; exit 0 when valid, 1 when invalid, 2 when unreadable'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "plan" -d 'Show what would change to make the host match the policy'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "apply" -d 'Make the host (or a simulated host) match the policy'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "check" -d 'Exit 0 when the host matches the policy, 1 when changes are pending'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "shell" -d 'Start your login shell in a team\'s share (its GPUs, limits and environment)'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "run" -d 'Run one command in a team\'s share; its exit status is passed through'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "env" -d 'Print a team\'s environment (shell, systemd EnvironmentFile, JSON) or its container share (cdi flags; docker flags or a compose service for Docker without CDI)'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "teams" -d 'List the teams you may join and what each gives'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "status" -d 'What gpuctld reports: teams, GPUs, last reconcile, last policy error'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "import" -d 'Turn another tool\'s GPU layout (NVIDIA mig-parted) into a policy drop-in'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "doctor" -d 'Is this host ready for gpuctl? Read-only checks of driver, cgroups, systemd, devices, MIG'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "top" -d 'Who uses which GPU and MIG device: teams, users, units, memory, strays'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "metrics" -d 'gpuctld\'s Prometheus metrics, on stdout or as a node_exporter textfile'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "idle" -d 'Holders of GPU shares that their team\'s idle rule flags: idle, warned, being stopped'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "device" -d 'Device health: list, drain a device for maintenance, bring one back'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "report" -d 'GPU-hours held and used per team, user or device, from gpuctld\'s ledger'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "events" -d 'Your events: idle warnings and stops, queued jobs started, loans taken back, devices out of service'
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "export" -d 'This host\'s GPUs in another tool\'s terms: Slurm\'s gres.conf lines and Gres='
complete -c gpuctl -n "__fish_gpuctl_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand validate" -l as -d 'Validate the one FILE as if installed at DEST, merged with the host\'s other policy files' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand validate" -l root -d 'Resolve every host path (policy directories, /run, /var/lib, /dev, /proc) under DIR' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand validate" -l json -d 'Print one JSON object for config management: {"valid", "files", "unreadable", "diagnostics": [{"severity", "file", "line", "column", "key", "message", "help"}]}'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand validate" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand validate" -s V -l version -d 'Print version'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand plan" -l simulate -d 'Plan against a simulated host, e.g. `h100-80gb*8` or `a100-40gb*4,h200*2`. Models: every entry of data/gpu-profiles.json by its simulate name or alias (a100, a800, h100, h800, h20, h200-nvl, gh200, b200, gb200, b300, rtx-pro-6000, a30, …) and l40s (no MIG); an unknown name is answered with the list' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand plan" -l state -d 'State file of the simulated host (JSON); created from SPEC when missing, updated by apply. Given alone, the host it describes is reused' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand plan" -l root -d 'Resolve every host path (policy directories, /run, /var/lib, /dev, /proc) under DIR' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand plan" -l json -d 'Machine-readable output: the plan and what each team gets'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand plan" -s h -l help -d 'Print help'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand plan" -s V -l version -d 'Print version'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand apply" -l simulate -d 'Plan against a simulated host, e.g. `h100-80gb*8` or `a100-40gb*4,h200*2`. Models: every entry of data/gpu-profiles.json by its simulate name or alias (a100, a800, h100, h800, h20, h200-nvl, gh200, b200, gb200, b300, rtx-pro-6000, a30, …) and l40s (no MIG); an unknown name is answered with the list' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand apply" -l state -d 'State file of the simulated host (JSON); created from SPEC when missing, updated by apply. Given alone, the host it describes is reused' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand apply" -l lock-wait -d 'With --local: how long to wait for another writer (gpuctld\'s reconcile, another `apply --local`) to finish before giving up, naming it' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand apply" -l root -d 'Resolve every host path (policy directories, /run, /var/lib, /dev, /proc) under DIR' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand apply" -l local -d 'Apply to this host in-process, without the daemon (as root; for recovery and scripts). Without a reachable systemd only MIG and files are applied, the other steps are listed as skipped'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand apply" -s h -l help -d 'Print help'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand apply" -s V -l version -d 'Print version'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand check" -l simulate -d 'Plan against a simulated host, e.g. `h100-80gb*8` or `a100-40gb*4,h200*2`. Models: every entry of data/gpu-profiles.json by its simulate name or alias (a100, a800, h100, h800, h20, h200-nvl, gh200, b200, gb200, b300, rtx-pro-6000, a30, …) and l40s (no MIG); an unknown name is answered with the list' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand check" -l state -d 'State file of the simulated host (JSON); created from SPEC when missing, updated by apply. Given alone, the host it describes is reused' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand check" -l root -d 'Resolve every host path (policy directories, /run, /var/lib, /dev, /proc) under DIR' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand check" -s h -l help -d 'Print help'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand check" -s V -l version -d 'Print version'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand shell" -s t -l team -d 'The team whose share the shell runs in' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand shell" -l gpus -d 'How many devices of the team\'s share (a number, or `all`); default from the team\'s policy, else 1. A job gets one MIG device at most' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand shell" -l device -d 'The device to run on: its UUID, MIG UUID, or its number in `gpuctl teams`' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand shell" -l gpu-memory -d 'Cap on the job\'s GPU memory (e.g. 10G), enforced by the device\'s MPS daemon; refused where no MPS daemon serves the device' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand shell" -l wait -d 'When no device is free, wait in gpuctld\'s queue (round-robin across users) for at most DURATION (e.g. 10m), or without a limit when none is given' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand shell" -l profile -d 'One MIG device of this GPU-instance profile (e.g. 3g.40gb), never a whole GPU. With --wait, a profile the share has no device of waits for a GPU to take a policy layout that gives the team one' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand shell" -l root -d 'Resolve every host path (policy directories, /run, /var/lib, /dev, /proc) under DIR' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand shell" -l borrow -d 'When the team\'s own share has no free device, run on a device another team lends (its `[teams.NAME.lend]`); the job is preemptible: it gets a notice, SIGTERM and the lender\'s grace when the owner wants the device back. Default: the team\'s `borrow`'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand shell" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand shell" -s V -l version -d 'Print version'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand run" -s t -l team -d 'The team whose share the command runs in' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand run" -l gpus -d 'How many devices of the team\'s share (a number, or `all`); default from the team\'s policy, else 1. A job gets one MIG device at most' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand run" -l device -d 'The device to run on: its UUID, MIG UUID, or its number in `gpuctl teams`' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand run" -l gpu-memory -d 'Cap on the job\'s GPU memory (e.g. 10G), enforced by the device\'s MPS daemon; refused where no MPS daemon serves the device' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand run" -l wait -d 'When no device is free, wait in gpuctld\'s queue (round-robin across users) for at most DURATION (e.g. 10m), or without a limit when none is given' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand run" -l profile -d 'One MIG device of this GPU-instance profile (e.g. 3g.40gb), never a whole GPU. With --wait, a profile the share has no device of waits for a GPU to take a policy layout that gives the team one' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand run" -l root -d 'Resolve every host path (policy directories, /run, /var/lib, /dev, /proc) under DIR' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand run" -l borrow -d 'When the team\'s own share has no free device, run on a device another team lends (its `[teams.NAME.lend]`); the job is preemptible: it gets a notice, SIGTERM and the lender\'s grace when the owner wants the device back. Default: the team\'s `borrow`'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand run" -l requeue -d 'On a borrowed device: when its owner takes it back, run CMD again once a device is free (queued like --wait, for its DURATION, else without limit). gpuctl then stays as CMD\'s parent instead of replacing itself'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand run" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand run" -s V -l version -d 'Print version'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand env" -s t -l team -d 'The team' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand env" -l format -d 'Output format' -r -f -a "shell\t'`export KEY=\'value\'` lines for `eval`'
systemd\t'`KEY=value` lines for `EnvironmentFile=` or `docker --env-file`'
json\t'One JSON object'
cdi\t'The container engine flags for the team\'s CDI device and slice, one line to paste after `podman run` (`--device gpuctl.io/team=T --cgroup-parent=gpu-T.slice`)'
docker\t'The `docker run` flags for the team\'s share, one line: `--cgroup-parent`, a `--device` per node, `-e` per variable, a `--mount` per MPS pipe directory. Inside a placed `gpuctl run --team T`, only the job\'s devices'
compose\t'The same as a docker-compose service (`cgroup_parent`, `devices`, `environment`, `volumes`), to use as an override file'"
complete -c gpuctl -n "__fish_gpuctl_using_subcommand env" -l service -d 'With `--format compose`: the compose service the fragment is for (default: the team)' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand env" -l root -d 'Resolve every host path (policy directories, /run, /var/lib, /dev, /proc) under DIR' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand env" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand env" -s V -l version -d 'Print version'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand teams" -l root -d 'Resolve every host path (policy directories, /run, /var/lib, /dev, /proc) under DIR' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand teams" -l json -d 'Print the daemon\'s JSON array'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand teams" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand teams" -s V -l version -d 'Print version'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand status" -l root -d 'Resolve every host path (policy directories, /run, /var/lib, /dev, /proc) under DIR' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand status" -l json -d 'Print the daemon\'s JSON document'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand status" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand status" -s V -l version -d 'Print version'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand import; and not __fish_seen_subcommand_from mig-parted help" -l root -d 'Resolve every host path (policy directories, /run, /var/lib, /dev, /proc) under DIR' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand import; and not __fish_seen_subcommand_from mig-parted help" -s h -l help -d 'Print help'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand import; and not __fish_seen_subcommand_from mig-parted help" -s V -l version -d 'Print version'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand import; and not __fish_seen_subcommand_from mig-parted help" -f -a "mig-parted" -d 'Turn one config of an NVIDIA mig-parted file into a policy drop-in'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand import; and not __fish_seen_subcommand_from mig-parted help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand import; and __fish_seen_subcommand_from mig-parted" -s c -l config -d 'The config of `mig-configs` to import' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand import; and __fish_seen_subcommand_from mig-parted" -l owner -d 'The team that owns every imported share (default: a placeholder to replace)' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand import; and __fish_seen_subcommand_from mig-parted" -s o -l output -d 'Write the drop-in here instead of stdout' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand import; and __fish_seen_subcommand_from mig-parted" -l root -d 'Resolve every host path (policy directories, /run, /var/lib, /dev, /proc) under DIR' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand import; and __fish_seen_subcommand_from mig-parted" -l skip-unsupported -d 'Write the drop-in even when some fields cannot be imported (they are listed in it)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand import; and __fish_seen_subcommand_from mig-parted" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand import; and __fish_seen_subcommand_from mig-parted" -s V -l version -d 'Print version'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand import; and __fish_seen_subcommand_from help" -f -a "mig-parted" -d 'Turn one config of an NVIDIA mig-parted file into a policy drop-in'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand import; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand doctor" -l record -d 'Also write what the driver reported, in the fake NVML\'s state format, to FILE (replay it with FAKE_NVML_STATE=FILE)' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand doctor" -l nvml-library -d 'NVML library to load' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand doctor" -l mps-control -d 'nvidia-cuda-mps-control to look for (under --root)' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand doctor" -l root -d 'Resolve every host path (policy directories, /run, /var/lib, /dev, /proc) under DIR' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand doctor" -l json -d 'Print one JSON object: {"checks": [{"id", "status", "summary"}], "ok", "warn", "fail"}'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand doctor" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand doctor" -s V -l version -d 'Print version'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand top" -l team -d 'Only devices the team owns and the team\'s processes elsewhere' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand top" -l interval -d 'Seconds between refreshes in live mode' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand top" -l root -d 'Resolve every host path (policy directories, /run, /var/lib, /dev, /proc) under DIR' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand top" -l once -d 'Print one snapshot and exit (the default when stdout is not a terminal)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand top" -l json -d 'Print the `Usage` document as JSON (implies --once)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand top" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand top" -s V -l version -d 'Print version'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand metrics" -l format -d '`openmetrics` (what Prometheus scrapes) or `prometheus-text` (node_exporter\'s format)' -r -f -a "openmetrics\t''
prometheus-text\t''"
complete -c gpuctl -n "__fish_gpuctl_using_subcommand metrics" -l textfile -d 'Write to PATH (e.g. /var/lib/prometheus/node-exporter/gpuctl.prom) in `prometheus-text` format instead of printing' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand metrics" -l root -d 'Resolve every host path (policy directories, /run, /var/lib, /dev, /proc) under DIR' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand metrics" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand metrics" -s V -l version -d 'Print version'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand idle" -l root -d 'Resolve every host path (policy directories, /run, /var/lib, /dev, /proc) under DIR' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand idle" -l json -d 'Print the daemon\'s JSON document (every tracked holder, busy ones too)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand idle" -l all -d 'Also list holders that are busy or idle for less than their window'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand idle" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand idle" -s V -l version -d 'Print version'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand device; and not __fish_seen_subcommand_from list drain resume help" -l root -d 'Resolve every host path (policy directories, /run, /var/lib, /dev, /proc) under DIR' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand device; and not __fish_seen_subcommand_from list drain resume help" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand device; and not __fish_seen_subcommand_from list drain resume help" -s V -l version -d 'Print version'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand device; and not __fish_seen_subcommand_from list drain resume help" -f -a "list" -d 'Every device: in or out of service, why and since when, XIDs seen'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand device; and not __fish_seen_subcommand_from list drain resume help" -f -a "drain" -d 'Take a device out of service (root)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand device; and not __fish_seen_subcommand_from list drain resume help" -f -a "resume" -d 'Bring a device back into service (root)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand device; and not __fish_seen_subcommand_from list drain resume help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand device; and __fish_seen_subcommand_from list" -l root -d 'Resolve every host path (policy directories, /run, /var/lib, /dev, /proc) under DIR' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand device; and __fish_seen_subcommand_from list" -l json -d 'Print the daemon\'s JSON document'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand device; and __fish_seen_subcommand_from list" -s h -l help -d 'Print help'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand device; and __fish_seen_subcommand_from list" -s V -l version -d 'Print version'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand device; and __fish_seen_subcommand_from drain" -l reason -d 'Why (kept in the journal and shown by status)' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand device; and __fish_seen_subcommand_from drain" -l root -d 'Resolve every host path (policy directories, /run, /var/lib, /dev, /proc) under DIR' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand device; and __fish_seen_subcommand_from drain" -s h -l help -d 'Print help'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand device; and __fish_seen_subcommand_from drain" -s V -l version -d 'Print version'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand device; and __fish_seen_subcommand_from resume" -l reason -d 'Why' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand device; and __fish_seen_subcommand_from resume" -l root -d 'Resolve every host path (policy directories, /run, /var/lib, /dev, /proc) under DIR' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand device; and __fish_seen_subcommand_from resume" -s h -l help -d 'Print help'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand device; and __fish_seen_subcommand_from resume" -s V -l version -d 'Print version'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand device; and __fish_seen_subcommand_from help" -f -a "list" -d 'Every device: in or out of service, why and since when, XIDs seen'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand device; and __fish_seen_subcommand_from help" -f -a "drain" -d 'Take a device out of service (root)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand device; and __fish_seen_subcommand_from help" -f -a "resume" -d 'Bring a device back into service (root)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand device; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand report" -l since -d 'The last N days (`30d`, `2w`), today included [default: 7d]' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand report" -l from -d 'First day, YYYY-MM-DD (UTC)' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand report" -l to -d 'Last day, YYYY-MM-DD (UTC), inclusive [default: today]' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand report" -l by -d 'Group rows by team, user (within team) or device' -r -f -a "team\t''
user\t''
device\t''"
complete -c gpuctl -n "__fish_gpuctl_using_subcommand report" -l root -d 'Resolve every host path (policy directories, /run, /var/lib, /dev, /proc) under DIR' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand report" -l json -d 'Print the daemon\'s JSON document (times in seconds)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand report" -l csv -d 'Print CSV (times in hours)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand report" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand report" -s V -l version -d 'Print version'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand events" -s n -l lines -d 'Print at most the last N events kept before new ones (default: all; 10 with --follow; 0: only new ones)' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand events" -l root -d 'Resolve every host path (policy directories, /run, /var/lib, /dev, /proc) under DIR' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand events" -s f -l follow -d 'Keep printing events as they happen (until interrupted)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand events" -l json -d 'One JSON object per event and line (fields of the bus reply\'s events)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand events" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand events" -s V -l version -d 'Print version'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand export; and not __fish_seen_subcommand_from slurm alertmanager help" -l root -d 'Resolve every host path (policy directories, /run, /var/lib, /dev, /proc) under DIR' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand export; and not __fish_seen_subcommand_from slurm alertmanager help" -s h -l help -d 'Print help'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand export; and not __fish_seen_subcommand_from slurm alertmanager help" -s V -l version -d 'Print version'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand export; and not __fish_seen_subcommand_from slurm alertmanager help" -f -a "slurm" -d 'The gres.conf lines of the live layout (whole GPUs: File=, MIG devices: MultipleFiles= with their cap nodes), headed by the node\'s slurm.conf Gres='
complete -c gpuctl -n "__fish_gpuctl_using_subcommand export; and not __fish_seen_subcommand_from slurm alertmanager help" -f -a "alertmanager" -d 'An alertmanager.yml routing gpuctl\'s alerts by their team label to one receiver per team of the policy (and every alert to the admins\' receiver)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand export; and not __fish_seen_subcommand_from slurm alertmanager help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand export; and __fish_seen_subcommand_from slurm" -l simulate -d 'Plan against a simulated host, e.g. `h100-80gb*8` or `a100-40gb*4,h200*2`. Models: every entry of data/gpu-profiles.json by its simulate name or alias (a100, a800, h100, h800, h20, h200-nvl, gh200, b200, gb200, b300, rtx-pro-6000, a30, …) and l40s (no MIG); an unknown name is answered with the list' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand export; and __fish_seen_subcommand_from slurm" -l state -d 'State file of the simulated host (JSON); created from SPEC when missing, updated by apply. Given alone, the host it describes is reused' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand export; and __fish_seen_subcommand_from slurm" -l node -d 'The node\'s NodeName (default: [slurm] node-name, else the short host name)' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand export; and __fish_seen_subcommand_from slurm" -l root -d 'Resolve every host path (policy directories, /run, /var/lib, /dev, /proc) under DIR' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand export; and __fish_seen_subcommand_from slurm" -l gres -d 'Print only the node\'s Gres= value (`gpu:1g.10gb:4,gpu:3g.40gb:1`)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand export; and __fish_seen_subcommand_from slurm" -l node-file -d 'Print the slurm.conf fragment `[slurm] node-file` holds: `NodeName=DEFAULT Gres=…`'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand export; and __fish_seen_subcommand_from slurm" -l job-submit -d 'Print a job_submit.lua that allows a team\'s GPU types (`team-types`) only in the partition named after the team (docs/slurm.md)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand export; and __fish_seen_subcommand_from slurm" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand export; and __fish_seen_subcommand_from slurm" -s V -l version -d 'Print version'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand export; and __fish_seen_subcommand_from alertmanager" -l webhook -d 'A webhook URL per team (`http://hooks.example.org/gpu/{team}`)' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand export; and __fish_seen_subcommand_from alertmanager" -l slack-channel -d 'A Slack channel per team (`#gpu-{team}`)' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand export; and __fish_seen_subcommand_from alertmanager" -l slack-api-url-file -d 'The file holding each team\'s Slack webhook URL (`/etc/alertmanager/slack-{team}.url`)' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand export; and __fish_seen_subcommand_from alertmanager" -l email -d 'An e-mail address per team (`{team}-leads@example.org`)' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand export; and __fish_seen_subcommand_from alertmanager" -l smtp-smarthost -d 'The SMTP relay for --email (`smtp.example.org:25`)' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand export; and __fish_seen_subcommand_from alertmanager" -l smtp-from -d 'The sender for --email' -r
complete -c gpuctl -n "__fish_gpuctl_using_subcommand export; and __fish_seen_subcommand_from alertmanager" -l root -d 'Resolve every host path (policy directories, /run, /var/lib, /dev, /proc) under DIR' -r -F
complete -c gpuctl -n "__fish_gpuctl_using_subcommand export; and __fish_seen_subcommand_from alertmanager" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand export; and __fish_seen_subcommand_from alertmanager" -s V -l version -d 'Print version'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand export; and __fish_seen_subcommand_from help" -f -a "slurm" -d 'The gres.conf lines of the live layout (whole GPUs: File=, MIG devices: MultipleFiles= with their cap nodes), headed by the node\'s slurm.conf Gres='
complete -c gpuctl -n "__fish_gpuctl_using_subcommand export; and __fish_seen_subcommand_from help" -f -a "alertmanager" -d 'An alertmanager.yml routing gpuctl\'s alerts by their team label to one receiver per team of the policy (and every alert to the admins\' receiver)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand export; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from validate plan apply check shell run env teams status import doctor top metrics idle device report events export help" -f -a "validate" -d 'Check policy files; exit 0 when valid, 1 when invalid, 2 when unreadable'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from validate plan apply check shell run env teams status import doctor top metrics idle device report events export help" -f -a "plan" -d 'Show what would change to make the host match the policy'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from validate plan apply check shell run env teams status import doctor top metrics idle device report events export help" -f -a "apply" -d 'Make the host (or a simulated host) match the policy'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from validate plan apply check shell run env teams status import doctor top metrics idle device report events export help" -f -a "check" -d 'Exit 0 when the host matches the policy, 1 when changes are pending'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from validate plan apply check shell run env teams status import doctor top metrics idle device report events export help" -f -a "shell" -d 'Start your login shell in a team\'s share (its GPUs, limits and environment)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from validate plan apply check shell run env teams status import doctor top metrics idle device report events export help" -f -a "run" -d 'Run one command in a team\'s share; its exit status is passed through'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from validate plan apply check shell run env teams status import doctor top metrics idle device report events export help" -f -a "env" -d 'Print a team\'s environment (shell, systemd EnvironmentFile, JSON) or its container share (cdi flags; docker flags or a compose service for Docker without CDI)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from validate plan apply check shell run env teams status import doctor top metrics idle device report events export help" -f -a "teams" -d 'List the teams you may join and what each gives'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from validate plan apply check shell run env teams status import doctor top metrics idle device report events export help" -f -a "status" -d 'What gpuctld reports: teams, GPUs, last reconcile, last policy error'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from validate plan apply check shell run env teams status import doctor top metrics idle device report events export help" -f -a "import" -d 'Turn another tool\'s GPU layout (NVIDIA mig-parted) into a policy drop-in'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from validate plan apply check shell run env teams status import doctor top metrics idle device report events export help" -f -a "doctor" -d 'Is this host ready for gpuctl? Read-only checks of driver, cgroups, systemd, devices, MIG'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from validate plan apply check shell run env teams status import doctor top metrics idle device report events export help" -f -a "top" -d 'Who uses which GPU and MIG device: teams, users, units, memory, strays'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from validate plan apply check shell run env teams status import doctor top metrics idle device report events export help" -f -a "metrics" -d 'gpuctld\'s Prometheus metrics, on stdout or as a node_exporter textfile'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from validate plan apply check shell run env teams status import doctor top metrics idle device report events export help" -f -a "idle" -d 'Holders of GPU shares that their team\'s idle rule flags: idle, warned, being stopped'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from validate plan apply check shell run env teams status import doctor top metrics idle device report events export help" -f -a "device" -d 'Device health: list, drain a device for maintenance, bring one back'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from validate plan apply check shell run env teams status import doctor top metrics idle device report events export help" -f -a "report" -d 'GPU-hours held and used per team, user or device, from gpuctld\'s ledger'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from validate plan apply check shell run env teams status import doctor top metrics idle device report events export help" -f -a "events" -d 'Your events: idle warnings and stops, queued jobs started, loans taken back, devices out of service'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from validate plan apply check shell run env teams status import doctor top metrics idle device report events export help" -f -a "export" -d 'This host\'s GPUs in another tool\'s terms: Slurm\'s gres.conf lines and Gres='
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and not __fish_seen_subcommand_from validate plan apply check shell run env teams status import doctor top metrics idle device report events export help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and __fish_seen_subcommand_from import" -f -a "mig-parted" -d 'Turn one config of an NVIDIA mig-parted file into a policy drop-in'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and __fish_seen_subcommand_from device" -f -a "list" -d 'Every device: in or out of service, why and since when, XIDs seen'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and __fish_seen_subcommand_from device" -f -a "drain" -d 'Take a device out of service (root)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and __fish_seen_subcommand_from device" -f -a "resume" -d 'Bring a device back into service (root)'
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and __fish_seen_subcommand_from export" -f -a "slurm" -d 'The gres.conf lines of the live layout (whole GPUs: File=, MIG devices: MultipleFiles= with their cap nodes), headed by the node\'s slurm.conf Gres='
complete -c gpuctl -n "__fish_gpuctl_using_subcommand help; and __fish_seen_subcommand_from export" -f -a "alertmanager" -d 'An alertmanager.yml routing gpuctl\'s alerts by their team label to one receiver per team of the policy (and every alert to the admins\' receiver)'
