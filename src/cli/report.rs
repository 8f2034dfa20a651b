//! `gpuctl report`: GPU-hours held and used per team, user or device, from gpuctld's ledger
//! (`Report` on the bus; docs/ledger.md).

use super::shell::{parse_reply, print_json, with_agent};
use crate::dbus_api::reply::{LedgerReply, LedgerRow};
use crate::ledger::{day_name, parse_day, DAY_MS};
use clap::Args;

/// Arguments of `gpuctl report`.
#[derive(Debug, Args)]
#[command(
    after_long_help = "Device-hours held (a process on the device), active (device \
activity at or above the team's idle threshold: [teams.NAME.idle] below, else 5%), unknown (the \
device reports no activity: never idle nor active), idle (held - active - unknown), utilisation \
(active / (held - unknown); no figure where that is 0), GPU-memory GiB-hours, and for teams with \
an idle rule the hours reclaimed (held time that an idle stop ended). Whole UTC days. A member \
sees the teams it may use; root sees all. gpuctld keeps the ledger while a team has an idle rule, \
or always with [host] accounting = \"on\" (gpuctl.policy(5)).

Exit status: 0; 6 gpuctld not running; 2 other failure."
)]
pub struct ReportArgs {
    /// The last N days (`30d`, `2w`), today included [default: 7d].
    #[arg(long, value_name = "N{d|w}", conflicts_with = "from")]
    pub since: Option<String>,
    /// First day, YYYY-MM-DD (UTC).
    #[arg(long, value_name = "DAY")]
    pub from: Option<String>,
    /// Last day, YYYY-MM-DD (UTC), inclusive [default: today].
    #[arg(long, value_name = "DAY")]
    pub to: Option<String>,
    /// Group rows by team, user (within team) or device.
    #[arg(long, default_value = "team", value_parser = ["team", "user", "device"])]
    pub by: String,
    /// Print the daemon's JSON document (times in seconds).
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// Print CSV (times in hours).
    #[arg(long)]
    pub csv: bool,
}

/// Days in `30d` / `2w`.
fn parse_since(s: &str) -> Option<u64> {
    let (n, unit) = s.split_at(s.len().checked_sub(1)?);
    let n: u64 = n.parse().ok().filter(|n| *n > 0)?;
    match unit {
        "d" => Some(n),
        "w" => n.checked_mul(7),
        _ => None,
    }
}

/// The (from, to) days the arguments name, `today` being the current UTC day.
fn range(a: &ReportArgs, today: u64) -> Result<(String, String), String> {
    let day = |s: &str| parse_day(s).ok_or_else(|| format!("{s:?} is not a day (YYYY-MM-DD)"));
    let to = a.to.as_deref().map_or(Ok(today), day)?;
    let from = match (&a.from, &a.since) {
        (Some(f), _) => day(f)?,
        (None, s) => {
            let s = s.as_deref().unwrap_or("7d");
            let n = parse_since(s).ok_or_else(|| format!("--since {s:?}: expected Nd or Nw"))?;
            to.saturating_sub(n - 1)
        }
    };
    if from > to {
        return Err(format!(
            "--from {} is after --to {}",
            day_name(from),
            day_name(to)
        ));
    }
    Ok((day_name(from), day_name(to)))
}

fn hours(s: f64) -> String {
    format!("{:.1}", s / 3600.0)
}

fn util(r: &LedgerRow) -> String {
    r.utilisation
        .map_or_else(|| "-".into(), |u| format!("{:.0}%", u * 100.0))
}

/// A row's name: its team (empty: processes outside every team slice), user (empty: the
/// team's device-time held by borrowers), device and kind, as its grouping keeps them.
fn who(r: &LedgerRow) -> String {
    let named = |v: &Option<String>, empty: &str| {
        v.as_deref()
            .map(|v| if v.is_empty() { empty } else { v }.to_string())
    };
    [
        named(&r.team, "(no team)"),
        named(&r.user, "(lent)"),
        named(&r.device, ""),
        named(&r.kind, ""),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join(" ")
}

/// The terminal view.
pub fn render(r: &LedgerReply) -> String {
    let mut o = format!(
        "GPU device-hours {} to {} (UTC), by {}{}\n",
        r.from,
        r.to,
        r.by,
        if r.all_teams { "" } else { " (your teams)" }
    );
    for p in &r.problems {
        o.push_str(&format!("warning: {p}\n"));
    }
    if r.rows.is_empty() {
        o.push_str("no ledger data in this range");
        o.push_str(match r.accounting.as_str() {
            "off" => ": accounting is off ([host] accounting)\n",
            "auto" if r.idle_rule_teams.is_empty() => {
                ": gpuctld accounts while a team has an idle rule, or with [host] accounting = \"on\"\n"
            }
            _ => "\n",
        });
        return o;
    }
    let head = match r.by.as_str() {
        "user" => "TEAM USER",
        "device" => "DEVICE KIND",
        _ => "TEAM",
    };
    // Loans only where a row has any: a host that does not lend keeps its table.
    let loans = r.rows.iter().any(|x| x.lent_s > 0.0 || x.borrowed_s > 0.0);
    let loan_cols = |lent: &str, borrowed: &str| {
        if loans {
            format!(" {lent:>8} {borrowed:>8}")
        } else {
            String::new()
        }
    };
    o.push_str(&format!(
        "{:<28} {:>8} {:>8} {:>8} {:>8} {:>5} {:>9} {:>10}{}\n",
        head,
        "HELD h",
        "ACTIVE h",
        "UNKNOWN",
        "IDLE h",
        "UTIL",
        "MEM GiBh",
        "RECLAIMED",
        loan_cols("LENT h", "BORROW h")
    ));
    for row in &r.rows {
        let with_rule = row
            .team
            .as_ref()
            .is_some_and(|t| r.idle_rule_teams.contains(t));
        let reclaimed = if with_rule || row.stops > 0 {
            format!("{} ({})", hours(row.reclaimed_s), row.stops)
        } else {
            "-".into()
        };
        o.push_str(&format!(
            "{:<28} {:>8} {:>8} {:>8} {:>8} {:>5} {:>9.1} {:>10}{}\n",
            who(row),
            hours(row.held_s),
            hours(row.active_s),
            hours(row.unknown_s),
            hours(row.idle_s),
            util(row),
            row.memory_gib_hours,
            reclaimed,
            loan_cols(&hours(row.lent_s), &hours(row.borrowed_s))
        ));
    }
    if !r.top_idle.is_empty() {
        o.push_str("\ntop holders by idle hours\n");
        o.push_str(&format!(
            "{:<28} {:>8} {:>8} {:>5}\n",
            "TEAM USER", "IDLE h", "HELD h", "UTIL"
        ));
        for row in &r.top_idle {
            o.push_str(&format!(
                "{:<28} {:>8} {:>8} {:>5}\n",
                who(row),
                hours(row.idle_s),
                hours(row.held_s),
                util(row)
            ));
        }
    }
    o
}

fn csv_field(v: &str) -> String {
    if v.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", v.replace('"', "\"\""))
    } else {
        v.to_string()
    }
}

/// CSV, one line per row, times in hours.
pub fn csv(r: &LedgerReply) -> String {
    let mut o = String::from(
        "team,user,device,kind,held_hours,active_hours,unknown_hours,idle_hours,utilisation,\
         memory_gib_hours,reclaimed_hours,stops,lent_hours,borrowed_hours\n",
    );
    for row in &r.rows {
        let h = |s: f64| format!("{:.4}", s / 3600.0);
        let f = [&row.team, &row.user, &row.device, &row.kind]
            .map(|v| csv_field(v.as_deref().unwrap_or("")));
        o.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{:.4},{},{},{},{}\n",
            f[0],
            f[1],
            f[2],
            f[3],
            h(row.held_s),
            h(row.active_s),
            h(row.unknown_s),
            h(row.idle_s),
            row.utilisation.map_or(String::new(), |u| format!("{u:.4}")),
            row.memory_gib_hours,
            h(row.reclaimed_s),
            row.stops,
            h(row.lent_s),
            h(row.borrowed_s)
        ));
    }
    o
}

/// Run `gpuctl report`.
pub fn run(args: &ReportArgs) -> i32 {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let today = now_ms / DAY_MS;
    let (from, to) = match range(args, today) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("gpuctl report: {e}");
            return super::exit::UNREADABLE;
        }
    };
    let text = match with_agent("Report", async |p| p.report(&from, &to, &args.by).await) {
        Ok(t) => t,
        Err(f) => return f.report(),
    };
    if args.json {
        print_json(text);
        return super::exit::OK;
    }
    let r: LedgerReply = match parse_reply("Report", &text) {
        Ok(r) => r,
        Err(f) => return f.report(),
    };
    print!("{}", if args.csv { csv(&r) } else { render(&r) });
    super::exit::OK
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: ReportArgs,
    }

    fn args(v: &[&str]) -> ReportArgs {
        T::try_parse_from(std::iter::once("report").chain(v.iter().copied()))
            .unwrap()
            .a
    }

    #[test]
    fn ranges_from_since_and_explicit_days() {
        let today = parse_day("2026-12-03").unwrap();
        let r = |v: &[&str]| range(&args(v), today);
        assert_eq!(r(&[]), Ok(("2026-11-27".into(), "2026-12-03".into())));
        assert_eq!(r(&["--since", "30d"]).unwrap().0, "2026-11-04");
        assert_eq!(r(&["--since", "1w"]).unwrap().0, "2026-11-27");
        assert_eq!(r(&["--since", "1d"]).unwrap().0, "2026-12-03");
        assert_eq!(
            r(&["--from", "2026-11-01", "--to", "2026-11-30"]),
            Ok(("2026-11-01".into(), "2026-11-30".into()))
        );
        assert!(r(&["--since", "0d"]).is_err());
        assert!(r(&["--since", "3h"]).is_err());
        assert!(r(&["--from", "2026-12-04"]).is_err(), "after today");
        assert!(r(&["--from", "yesterday"]).is_err());
        assert!(T::try_parse_from(["report", "--since", "1d", "--from", "2026-01-01"]).is_err());
        assert!(T::try_parse_from(["report", "--by", "unit"]).is_err());
    }

    fn reply() -> LedgerReply {
        let row =
            |team: &str, user: Option<&str>, held: f64, active: f64, unknown: f64| LedgerRow {
                team: Some(team.into()),
                user: user.map(str::to_string),
                held_s: held,
                active_s: active,
                unknown_s: unknown,
                idle_s: held - active - unknown,
                utilisation: (held - unknown > 0.0).then(|| active / (held - unknown)),
                reclaimed_s: if team == "interns" { 1800.0 } else { 0.0 },
                stops: u64::from(team == "interns"),
                ..Default::default()
            };
        LedgerReply {
            accounting: "auto".into(),
            all_teams: true,
            by: "team".into(),
            from: "2026-11-27".into(),
            to: "2026-12-03".into(),
            idle_rule_teams: vec!["interns".into()],
            rows: vec![
                row("train", None, 36_000.0, 32_400.0, 0.0),
                row("interns", None, 7_200.0, 0.0, 0.0),
                row("mig", None, 3_600.0, 0.0, 3_600.0),
            ],
            top_idle: vec![row("interns", Some("bob, jr"), 7_200.0, 0.0, 0.0)],
            ..Default::default()
        }
    }

    #[test]
    fn the_table_shows_utilisation_reclaimed_and_idle_holders() {
        let s = render(&reply());
        let line = |t: &str| s.lines().find(|l| l.starts_with(t)).unwrap().to_string();
        let train = line("train ");
        assert!(
            train.contains("10.0") && train.contains("9.0") && train.contains("90%"),
            "{s}"
        );
        assert!(
            train.trim_end().ends_with('-'),
            "no idle rule: no reclaimed figure\n{s}"
        );
        let interns = line("interns ");
        assert!(
            interns.contains(" 0%") && interns.contains("0.5 (1)"),
            "{s}"
        );
        let mig = line("mig ");
        assert!(
            mig.contains("  - "),
            "unknown activity: no utilisation\n{s}"
        );
        assert!(s.contains("top holders by idle hours"), "{s}");
        assert!(line("interns bob, jr").contains("2.0"), "{s}");
        let empty = LedgerReply {
            accounting: "auto".into(),
            ..Default::default()
        };
        assert!(render(&empty).contains("accounting = \"on\""));
    }

    #[test]
    fn loans_get_their_columns_only_where_a_row_has_any() {
        let plain = render(&reply());
        assert!(!plain.contains("LENT h"), "{plain}");
        let mut r = reply();
        r.by = "user".into();
        r.rows[1].user = Some("bob".into());
        r.rows[1].borrowed_s = 3_600.0;
        r.rows.push(LedgerRow {
            team: Some("train".into()),
            user: Some(String::new()),
            lent_s: 3_600.0,
            ..Default::default()
        });
        let s = render(&r);
        assert!(
            s.lines()
                .next()
                .is_some_and(|_| s.contains("LENT h") && s.contains("BORROW h")),
            "{s}"
        );
        let lent = s
            .lines()
            .find(|l| l.starts_with("train (lent)"))
            .unwrap_or_default();
        assert!(lent.trim_end().ends_with("1.0      0.0"), "{s}");
        let bob = s
            .lines()
            .find(|l| l.starts_with("interns bob"))
            .unwrap_or_default();
        assert!(bob.trim_end().ends_with("0.0      1.0"), "{s}");
        let c = csv(&r);
        assert!(c
            .lines()
            .next()
            .unwrap_or_default()
            .ends_with(",lent_hours,borrowed_hours"));
        assert!(
            c.lines()
                .any(|l| l.starts_with("train,,,,0.0000,") && l.ends_with(",1.0000,0.0000")),
            "{c}"
        );
    }

    #[test]
    fn csv_quotes_and_leaves_missing_utilisation_empty() {
        let mut r = reply();
        r.rows[0].user = Some("bob, jr".into());
        let c = csv(&r);
        let lines: Vec<&str> = c.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(lines[0].starts_with("team,user,device,kind,held_hours"));
        assert!(
            lines[1].starts_with("train,\"bob, jr\",,,10.0000,9.0000,"),
            "{c}"
        );
        assert!(lines[1].contains(",0.9000,"), "{c}");
        assert!(
            lines[3].starts_with("mig,,,,1.0000,0.0000,1.0000,0.0000,,"),
            "{c}"
        );
    }
}
