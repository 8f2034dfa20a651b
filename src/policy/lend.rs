//! `[teams.NAME.lend]`: which idle devices of a team other teams may borrow, when, and how long a
//! borrower gets to stop when the owner wants a device back (docs/policy.md, "Lending idle
//! devices"); and the calendar windows of its `when` key.
//!
//! The window grammar is a small subset of systemd's calendar syntax (systemd.time(7)): weekday
//! lists and ranges, and one optional `HH:MM..HH:MM` time range that may wrap midnight. Whether
//! a window is open at a given local time is [`crate::lending`]'s question.

use super::TeamName;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// A team's lending rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LendRule {
    /// Who may borrow.
    pub to: LendTo,
    /// How long a device must have had no lease and no process before it is lent.
    pub after: Duration,
    /// How long a borrower gets between its notice (and SIGTERM) and the stop of its scope.
    pub grace: Duration,
    /// When lending is allowed; empty: always.
    pub when: Vec<Window>,
}

impl LendRule {
    /// Default `after`.
    pub const DEFAULT_AFTER: Duration = Duration::from_secs(10 * 60);
    /// Default `grace`.
    pub const DEFAULT_GRACE: Duration = Duration::from_secs(60);

    /// Whether `team` may borrow under this rule (never the owner itself).
    pub fn lends_to(&self, owner: &str, team: &str) -> bool {
        team != owner
            && match &self.to {
                LendTo::All => true,
                LendTo::Teams(ts) => ts.iter().any(|t| &**t == team),
            }
    }
}

/// `to`: every other team, or the ones named.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LendTo {
    /// `to = "all"`.
    All,
    /// `to = ["interns", "research"]`.
    Teams(Vec<TeamName>),
}

/// The longest `grace`: an owner's job waits up to this long for a lent device.
pub const MAX_LEND_GRACE: Duration = Duration::from_secs(3600);
/// The longest `fair-share-half-life`: past usage older than a few of these counts for nothing.
pub const MAX_HALF_LIFE: Duration = Duration::from_secs(90 * 86_400);
/// Default `[host] fair-share-half-life`.
pub const DEFAULT_HALF_LIFE: Duration = Duration::from_secs(7 * 86_400);

/// Minutes in a day: a window's time range ends at most here (`24:00`).
pub const DAY_MINUTES: u16 = 24 * 60;

/// The weekday names in order, Monday first (as systemd writes them).
pub const WEEKDAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
const LONG_WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// One calendar window: on these weekdays, optionally only between two times of day. A time
/// range that wraps midnight belongs to the day it starts on: `Fri 20:00..08:00` is Friday 20:00
/// to Saturday 08:00.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Window {
    /// Bit `d` set: weekday `d` (0 = Monday) is in the window.
    pub days: u8,
    /// Start and end, minutes after local midnight (`end` up to [`DAY_MINUTES`]); `None`: the
    /// whole day.
    pub time: Option<(u16, u16)>,
    /// As written.
    pub text: String,
}

/// Help for a window that does not parse.
pub const WINDOW_HELP: &str = "a window is weekdays and/or a time range, e.g. \
     \"Mon..Fri 20:00..08:00\", \"Sat,Sun\" or \"22:00..06:00\" (weekdays Mon..Sun, times \
     HH:MM from 00:00 to 24:00)";

impl Window {
    /// Parse `Mon..Fri 20:00..08:00`, `Sat,Sun`, `22:00..06:00`; the error in words.
    pub fn parse(text: &str) -> Result<Window, String> {
        let parts: Vec<&str> = text.split_whitespace().collect();
        let (days, time) = match parts.as_slice() {
            [one] if one.contains(':') => (None, Some(*one)),
            [one] => (Some(*one), None),
            [d, t] => (Some(*d), Some(*t)),
            [] => return Err("empty window".into()),
            _ => {
                return Err(format!(
                    "{}: expected weekdays and a time range separated by one space",
                    crate::settings::value::quote(text)
                ))
            }
        };
        let days = match days {
            None => 0x7f,
            Some(d) => weekdays(d)?,
        };
        let time = time.map(time_range).transpose()?;
        Ok(Window {
            days,
            time,
            text: parts.join(" "),
        })
    }

    /// Whether minute `minute` (of the day) of weekday `day` (0 = Monday) is inside.
    pub fn contains(&self, day: u8, minute: u16) -> bool {
        let on = |d: u8| self.days & (1 << (d % 7)) != 0;
        match self.time {
            None => on(day),
            Some((s, e)) if s < e => on(day) && (s..e).contains(&minute),
            // Wraps midnight: the evening of a listed day, and the morning after it.
            Some((s, e)) => (on(day) && minute >= s) || (on((day + 6) % 7) && minute < e),
        }
    }
}

impl TryFrom<String> for Window {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        Window::parse(&s)
    }
}

impl From<Window> for String {
    fn from(w: Window) -> String {
        w.text
    }
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

fn weekday(s: &str) -> Result<u8, String> {
    (0..7u8)
        .find(|&i| {
            s.eq_ignore_ascii_case(WEEKDAYS[i as usize])
                || s.eq_ignore_ascii_case(LONG_WEEKDAYS[i as usize])
        })
        .ok_or_else(|| {
            format!(
                "{} is not a weekday (Mon, Tue, Wed, Thu, Fri, Sat, Sun)",
                crate::settings::value::quote(s)
            )
        })
}

/// `Mon..Fri,Sun` as a bit set.
fn weekdays(s: &str) -> Result<u8, String> {
    let mut set = 0u8;
    for item in s.split(',') {
        let (a, b) = match item.split_once("..") {
            Some((a, b)) => (weekday(a)?, weekday(b)?),
            None => {
                let d = weekday(item)?;
                (d, d)
            }
        };
        if a > b {
            return Err(format!(
                "{}: a weekday range runs forward, Mon to Sun (write \"{}..Sun,Mon..{}\")",
                crate::settings::value::quote(item),
                WEEKDAYS[a as usize],
                WEEKDAYS[b as usize]
            ));
        }
        for d in a..=b {
            set |= 1 << d;
        }
    }
    Ok(set)
}

fn clock(s: &str) -> Result<u16, String> {
    let bad = || {
        format!(
            "{} is not a time of day (HH:MM, 00:00 to 24:00)",
            crate::settings::value::quote(s)
        )
    };
    let (h, m) = s.split_once(':').ok_or_else(bad)?;
    let ok = |x: &str| x.len() == 2 && x.bytes().all(|b| b.is_ascii_digit());
    if !ok(h) || !ok(m) {
        return Err(bad());
    }
    let (h, m): (u16, u16) = (h.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
    if m > 59 || h > 24 || (h == 24 && m > 0) {
        return Err(bad());
    }
    Ok(h * 60 + m)
}

fn time_range(s: &str) -> Result<(u16, u16), String> {
    let (a, b) = s.split_once("..").ok_or_else(|| {
        format!(
            "{}: a time range is HH:MM..HH:MM",
            crate::settings::value::quote(s)
        )
    })?;
    let (a, b) = (clock(a)?, clock(b)?);
    if a == DAY_MINUTES {
        return Err(format!(
            "{}: a range starts before 24:00",
            crate::settings::value::quote(s)
        ));
    }
    if a == b {
        return Err(format!(
            "{}: an empty time range (for the whole day, leave the time out)",
            crate::settings::value::quote(s)
        ));
    }
    // 22:00..24:00 and 22:00..00:00 are the same evening.
    Ok((a, if b == 0 { DAY_MINUTES } else { b }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_parse_as_systemd_writes_weekdays_and_times() {
        let w = Window::parse("Mon..Fri 20:00..08:00").unwrap();
        assert_eq!(w.days, 0b0011111);
        assert_eq!(w.time, Some((20 * 60, 8 * 60)));
        assert_eq!(Window::parse("Sat,Sun").unwrap().days, 0b1100000);
        assert_eq!(Window::parse("sunday").unwrap().days, 0b1000000);
        let all = Window::parse("  22:00..06:00 ").unwrap();
        assert_eq!((all.days, all.text.as_str()), (0x7f, "22:00..06:00"));
        assert_eq!(
            Window::parse("Mon,Wed..Thu 09:00..24:00").unwrap(),
            Window {
                days: 0b0001101,
                time: Some((540, DAY_MINUTES)),
                text: "Mon,Wed..Thu 09:00..24:00".into()
            }
        );
        assert_eq!(
            Window::parse("Tue 22:00..00:00").unwrap().time,
            Some((1320, DAY_MINUTES))
        );
        for (bad, why) in [
            ("", "empty"),
            ("Fri..Mon", "runs forward"),
            ("Mon..Fri 20:00..20:00", "empty time range"),
            ("Moon", "not a weekday"),
            ("Mon 8:00..9:00", "not a time of day"),
            ("Mon 20:00-08:00", "HH:MM..HH:MM"),
            ("Mon 24:00..08:00", "starts before 24:00"),
            ("Mon 23:60..08:00", "not a time of day"),
            ("Mon Tue 08:00..09:00", "one space"),
            ("Mon..", "not a weekday"),
        ] {
            let e = Window::parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn a_window_round_trips_through_its_text() {
        let w = Window::parse("Mon..Fri 20:00..08:00").unwrap();
        let j = serde_json::to_string(&w).unwrap();
        assert_eq!(j, "\"Mon..Fri 20:00..08:00\"");
        assert_eq!(serde_json::from_str::<Window>(&j).unwrap(), w);
        assert!(serde_json::from_str::<Window>("\"Fri..Mon\"").is_err());
    }

    #[test]
    fn a_night_belongs_to_the_day_it_starts_on() {
        let w = Window::parse("Mon..Fri 20:00..08:00").unwrap();
        let (mon, fri, sat, sun) = (0, 4, 5, 6);
        assert!(w.contains(mon, 20 * 60));
        assert!(!w.contains(mon, 20 * 60 - 1));
        assert!(!w.contains(mon, 7 * 60), "Monday morning is Sunday's night");
        assert!(w.contains(fri, 23 * 60));
        assert!(
            w.contains(sat, 7 * 60 + 59),
            "Friday's night runs into Saturday"
        );
        assert!(!w.contains(sat, 8 * 60));
        assert!(!w.contains(sun, 23 * 60));
        let day = Window::parse("Sat,Sun").unwrap();
        assert!(day.contains(sat, 0) && day.contains(sun, 1439) && !day.contains(fri, 1439));
        let late = Window::parse("Sun 22:00..24:00").unwrap();
        assert!(late.contains(sun, 1439) && !late.contains(mon, 0));
    }

    #[test]
    fn only_the_named_teams_and_never_the_owner_borrow() {
        let r = LendRule {
            to: LendTo::Teams(vec!["interns".parse().unwrap()]),
            after: LendRule::DEFAULT_AFTER,
            grace: LendRule::DEFAULT_GRACE,
            when: vec![],
        };
        assert!(r.lends_to("train", "interns"));
        assert!(!r.lends_to("train", "research"));
        let all = LendRule {
            to: LendTo::All,
            ..r
        };
        assert!(all.lends_to("train", "research"));
        assert!(!all.lends_to("train", "train"));
    }
}
