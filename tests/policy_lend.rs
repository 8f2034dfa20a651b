//! `[teams.NAME.lend]`, `[teams.NAME] borrow` and `[host] fair-share-half-life`: good values
//! become a `LendRule`, bad ones the usual `file:line:col: error: key: message` and no policy;
//! drop-ins merge per key.

mod common;

use common::write;
use gpuctl::policy::{load_files, LendTo};
use std::time::Duration;

/// Lines 1-11: three teams, train owning GPU 0 and 1; a tail's first line is line 12, in
/// `[teams.interns]`.
const HEAD: &str = "version = 1\n[[gpu]]\nindex = [0, 1]\nowner = \"train\"\n[teams.train]\nmembers = [\"ann\"]\n[teams.research]\nmembers = [\"cy\"]\n[teams.interns]\nmembers = [\"bo\"]\n\n";

/// Whether `HEAD` + `tail` is accepted, and its diagnostics with the temp dir cut from paths.
fn diags(tail: &str) -> (bool, Vec<String>) {
    let (p, d) = common::load_text(&format!("{HEAD}{tail}"));
    (p.is_some(), d)
}

fn policy(tail: &str) -> gpuctl::policy::Policy {
    let d = tempfile::tempdir().unwrap();
    let p = write(d.path(), "p.toml", &format!("{HEAD}{tail}"));
    let o = load_files(&[p]);
    o.policy.unwrap_or_else(|| panic!("{:?}", o.diagnostics))
}

#[test]
fn a_full_rule_parses_and_defaults_fill_the_rest() {
    let (ok, d) = diags(
        "borrow = true\n[teams.train.lend]\nto = [\"interns\", \"research\"]\nafter = \"10m\"\n\
         grace = \"60s\"\nwhen = [\"Mon..Fri 20:00..08:00\", \"Sat,Sun\"]\n\
         [host]\nfair-share-half-life = \"3d\"\n",
    );
    assert!(ok, "{d:?}");
    // No warning beyond the GPU-less teams'.
    assert!(d.iter().all(|l| l.contains("has no GPUs")), "{d:?}");
    let p = policy(
        "borrow = true\n[teams.train.lend]\nto = [\"interns\", \"research\"]\n\
         when = \"Sat,Sun\"\n[host]\nfair-share-half-life = \"3d\"\n",
    );
    let l = p.teams["train"].lend.clone().unwrap();
    assert_eq!(
        l.to,
        LendTo::Teams(vec![
            "interns".parse().unwrap(),
            "research".parse().unwrap()
        ])
    );
    assert_eq!(l.after, Duration::from_secs(600), "default after");
    assert_eq!(l.grace, Duration::from_secs(60), "default grace");
    assert_eq!(l.when.len(), 1);
    assert_eq!(l.when[0].to_string(), "Sat,Sun");
    assert!(p.teams["interns"].borrow);
    assert!(!p.teams["research"].borrow, "borrowing is off by default");
    assert_eq!(p.host.fair_share_half_life, Duration::from_secs(3 * 86_400));

    let p = policy("[teams.train.lend]\nto = \"all\"\n");
    assert_eq!(p.teams["train"].lend.as_ref().unwrap().to, LendTo::All);
    assert!(p.teams["train"].lend.as_ref().unwrap().when.is_empty());
    assert_eq!(p.teams["interns"].lend, None);
    assert_eq!(
        p.host.fair_share_half_life,
        Duration::from_secs(7 * 86_400),
        "a week by default"
    );
}

/// Every bad value: rejected, with file, line, column, key and a message naming the value.
#[test]
fn bad_values_name_file_line_and_key() {
    let cases: &[(&str, &str)] = &[
        (
            "to = [\"internz\"]",
            "p.toml:13:7: error: teams.train.lend.to: unknown team 'internz' (did you mean 'interns'?",
        ),
        (
            "to = [\"interns\", \"train\"]",
            "p.toml:13:18: error: teams.train.lend.to: team 'train' lends to itself",
        ),
        (
            "to = [\"interns\", \"interns\"]",
            "p.toml:13:18: error: teams.train.lend.to: team 'interns' is listed twice",
        ),
        (
            "to = []",
            "p.toml:13:6: error: teams.train.lend.to: lends to no team",
        ),
        (
            "to = \"everyone\"",
            "p.toml:13:6: error: teams.train.lend.to: 'everyone' is neither \"all\" nor a list",
        ),
        (
            "to = 3",
            "p.toml:13:6: error: teams.train.lend.to: expected \"all\" or a list of team names",
        ),
        (
            "after = \"10m\"",
            "p.toml:12:1: error: teams.train.lend: missing `to`",
        ),
        (
            "to = \"all\"\nafter = \"0s\"",
            "p.toml:14:9: error: teams.train.lend.after: the idle time must be longer than 0",
        ),
        (
            "to = \"all\"\nafter = \"31d\"",
            "p.toml:14:9: error: teams.train.lend.after: 2678400 s is over the maximum of 720 h (MAX_IDLE_WINDOW)",
        ),
        (
            "to = \"all\"\ngrace = \"2h\"",
            "p.toml:14:9: error: teams.train.lend.grace: 7200 s is over the maximum of 1 h (MAX_LEND_GRACE)",
        ),
        (
            "to = \"all\"\ngrace = 0",
            "p.toml:14:9: error: teams.train.lend.grace: a borrower's grace must be longer than 0",
        ),
        (
            "to = \"all\"\nwhen = \"Fri..Mon\"",
            "p.toml:14:8: error: teams.train.lend.when: 'Fri..Mon': a weekday range runs forward",
        ),
        (
            "to = \"all\"\nwhen = [\"Sat\", \"Mon..Fri 20:00..20:00\"]",
            "p.toml:14:8: error: teams.train.lend.when: '20:00..20:00': an empty time range",
        ),
        (
            "to = \"all\"\nwhen = [\"Mon 8pm..9pm\"]",
            "p.toml:14:8: error: teams.train.lend.when: '8pm' is not a time of day",
        ),
        (
            "to = \"all\"\nwhen = []",
            "p.toml:14:8: error: teams.train.lend.when: no window: nothing would ever be lent",
        ),
        (
            "to = \"all\"\nwhenn = \"Sat\"",
            "p.toml:14:1: error: teams.train.lend.whenn: unknown key 'whenn' (did you mean 'when'?",
        ),
    ];
    for (body, want) in cases {
        let (ok, d) = diags(&format!("[teams.train.lend]\n{body}\n"));
        assert!(!ok, "{body}: accepted: {d:?}");
        assert!(
            d.iter().any(|l| l.starts_with(want)),
            "{body}: want {want:?}, got {d:?}"
        );
    }
    for (tail, want) in [
        (
            "borrow = \"yes\"\n",
            "p.toml:12:10: error: teams.interns.borrow: expected true or false, found a string",
        ),
        (
            "[host]\nfair-share-half-life = \"100d\"\n",
            "p.toml:13:24: error: host.fair-share-half-life: 8640000 s is over the maximum of 2160 h (MAX_HALF_LIFE)",
        ),
        (
            "[host]\nfair-share-half-life = 0\n",
            "p.toml:13:24: error: host.fair-share-half-life: a half-life must be longer than 0",
        ),
        (
            "lend = \"train\"\n",
            "p.toml:12:8: error: teams.interns.lend: expected a table `[teams.NAME.lend]`",
        ),
    ] {
        let (ok, d) = diags(tail);
        assert!(!ok, "{tail}: accepted: {d:?}");
        assert!(
            d.iter().any(|l| l.starts_with(want)),
            "{tail}: want {want:?}, got {d:?}"
        );
    }
}

#[test]
fn mps_teams_and_borrowers_nobody_lends_to_are_warned() {
    let (ok, d) = diags("[teams.train.mps]\n[teams.train.lend]\nto = \"all\"\n");
    assert!(ok, "{d:?}");
    assert!(
        d.iter().any(|l| l.starts_with(
            "p.toml:13:1: warning: teams.train.lend: team 'train' lends less than it may seem: \
             the team runs MPS on its devices, and a device shared through MPS is never lent"
        )),
        "{d:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "p.toml",
        "version = 1\n[[gpu]]\nindex = [0]\nowner = \"train\"\n[teams.train]\n\
         [teams.train.lend]\nto = [\"interns\"]\n[teams.research]\nborrow = true\n\
         [teams.interns]\nborrow = true\n",
    );
    let o = load_files(&[p]);
    assert!(o.policy.is_some());
    let d: Vec<String> = o
        .diagnostics
        .iter()
        .map(|x| {
            x.to_string()
                .replace(&format!("{}/", dir.path().display()), "")
        })
        .filter(|l| l.contains("borrow"))
        .collect();
    assert_eq!(
        d,
        vec![
            "p.toml:9:10: warning: teams.research.borrow: no team lends to 'research': its jobs \
             have nothing to borrow (add it to a [teams.NAME.lend] `to` list)"
        ],
    );
}

#[test]
fn drop_ins_merge_per_key() {
    let d = tempfile::tempdir().unwrap();
    let a = write(
        d.path(),
        "10-base.toml",
        &format!("{HEAD}[teams.train.lend]\nto = [\"interns\"]\ngrace = \"30s\"\n"),
    );
    let b = write(
        d.path(),
        "20-site.toml",
        "version = 1\n[teams.train.lend]\nafter = \"1h\"\nwhen = \"Sat,Sun\"\n[teams.interns]\nborrow = true\n",
    );
    let p = load_files(&[a, b]).policy.unwrap();
    let l = p.teams["train"].lend.clone().unwrap();
    assert_eq!(l.to, LendTo::Teams(vec!["interns".parse().unwrap()]));
    assert_eq!(l.grace, Duration::from_secs(30), "kept from the lower file");
    assert_eq!(l.after, Duration::from_secs(3600), "the later file wins");
    assert_eq!(l.when[0].to_string(), "Sat,Sun");
    assert!(p.teams["interns"].borrow);
}
