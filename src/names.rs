//! Team names: parsed once where a name enters (a policy file, argv, the bus), then carried as
//! a type. A leaf: `observe` (below `policy`) and `policy` both name teams, and neither may import
//! the other for it.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A team name that may become a unit name (`gpu-<team>.slice`) and a file name
/// (`<team>.env`): `[a-z][a-z0-9_]{0,30}`. Parsed once where a name enters (argv, the bus);
/// what takes a `TeamName` does not check again.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TeamName(String);

impl std::str::FromStr for TeamName {
    type Err = BadTeamName;
    fn from_str(s: &str) -> Result<TeamName, BadTeamName> {
        if valid_team_name(s) {
            Ok(TeamName(s.to_string()))
        } else {
            Err(BadTeamName(s.to_string()))
        }
    }
}

impl TryFrom<String> for TeamName {
    type Error = BadTeamName;
    fn try_from(s: String) -> Result<TeamName, BadTeamName> {
        s.parse()
    }
}

impl From<TeamName> for String {
    fn from(t: TeamName) -> String {
        t.0
    }
}

impl std::ops::Deref for TeamName {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

/// Maps keyed by name are looked up with a `&str` (a name read back from systemd or a file is
/// compared, not trusted).
impl std::borrow::Borrow<str> for TeamName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for TeamName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TeamName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A name compares with the text it was parsed from, as `String` does.
impl PartialEq<str> for TeamName {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<String> for TeamName {
    fn eq(&self, other: &String) -> bool {
        self.0 == *other
    }
}

/// A string that is not a team name (kept whole; callers decide how much of it to show).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid team name {0:?}")]
pub struct BadTeamName(pub String);

/// Team names become unit names (`gpu-<team>.slice`); a `-` would nest the slice.
pub fn valid_team_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 31
        && b[0].is_ascii_lowercase()
        && b[1..]
            .iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_')
}

/// Why `name` is no team name, in words (for a name [`valid_team_name`] refused).
pub fn team_name_problem(name: &str) -> String {
    if name.contains('-') {
        format!(
            "a '-' would nest the slice: systemd reads gpu-{name}.slice as a child of \
             gpu-{}.slice; use '_' instead",
            name.split('-').next().unwrap_or_default()
        )
    } else {
        "team names become unit names (gpu-NAME.slice)".into()
    }
}

/// The team name `name` was most likely meant to be: lower case, `-` and `.` as `_`
/// (`ML-Infer` → `ml_infer`); `None` when that is no team name either.
pub fn team_name_fix(name: &str) -> Option<String> {
    let fixed: String = name
        .chars()
        .map(|c| match c {
            '-' | '.' | ' ' => '_',
            c => c.to_ascii_lowercase(),
        })
        .collect();
    (fixed != name && valid_team_name(&fixed)).then_some(fixed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_names_get_the_name_meant() {
        assert_eq!(team_name_fix("ml-infer").as_deref(), Some("ml_infer"));
        assert_eq!(team_name_fix("ML.Infer").as_deref(), Some("ml_infer"));
        assert_eq!(team_name_fix("../x"), None);
        assert_eq!(team_name_fix("infer"), None);
        assert!(team_name_problem("ml-infer").contains("use '_' instead"));
    }

    #[test]
    fn team_names() {
        for ok in ["a", "infer", "ml_team2", &"a".repeat(31)] {
            assert!(valid_team_name(ok), "{ok}");
        }
        for bad in [
            "",
            "Infer",
            "ml-team",
            "2team",
            "_x",
            &"a".repeat(32),
            "a.b",
            "a/b",
        ] {
            assert!(!valid_team_name(bad), "{bad}");
            assert_eq!(bad.parse::<TeamName>(), Err(BadTeamName(bad.to_string())));
        }
        let t: TeamName = "ml_team2".parse().unwrap();
        assert_eq!((&*t, t.to_string()), ("ml_team2", "ml_team2".to_string()));
        assert_eq!(serde_json::to_string(&t).unwrap(), "\"ml_team2\"");
        assert!(serde_json::from_str::<TeamName>("\"../x\"").is_err());
    }
}
