//! Team CDI specs on the host: `/var/run/cdi/gpuctl.io-team-<team>.json` (content from
//! [`crate::cdi::spec`], planned like env files), read back for the observation and written
//! through [`files::write_atomic`](crate::files::write_atomic).
//!
//! A spec is readable by root and the team's members only: mode 0640 owned by root:root, and a
//! POSIX ACL granting read to each member user and group (resolved through NSS when written), so
//! a non-member's container engine, which lists the directory as that user, does not find the
//! team's device. A spec others can read (written by a version before this rule) is observed as
//! absent, so the next plan writes it again; the ACL is read back ([`readers`]) so that the plan
//! rewrites a spec a removed member can still read.

use crate::cdi::{spec_path, CDI_DIR, FILE_PREFIX};
use crate::files::{remove_if_exists, write_atomic, FileError};
use crate::paths::Root;
use crate::policy::TeamName;
use std::collections::BTreeMap;
use std::path::PathBuf;

fn file(root: &Root, team: &str) -> PathBuf {
    root.join(spec_path(team))
}

/// The team specs on the host under `root`, by team: only files named as gpuctl names them
/// (other vendors' specs in the same directory are not ours to read or remove). A spec that
/// others may read is left out (see the module header).
pub fn read_all(root: &Root) -> Result<BTreeMap<TeamName, String>, FileError> {
    use std::os::unix::fs::PermissionsExt;
    let dir = root.join(CDI_DIR);
    let mut all = match std::fs::read_dir(&dir) {
        Ok(rd) => {
            super::read_team_files(rd, |n| n.strip_prefix(FILE_PREFIX)?.strip_suffix(".json"))?
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => return Err(FileError::new(&dir, e)),
    };
    all.retain(|team, _| {
        std::fs::metadata(file(root, team)).is_ok_and(|m| m.permissions().mode() & 0o007 == 0)
    });
    Ok(all)
}

/// Write a team's spec atomically (temp file, rename): an engine reading the directory sees the
/// old or the new spec, never a torn one (the temp file's name ends in neither `.json` nor
/// `.yaml`, so CDI never reads it). `readers` are the team's members as the policy names them
/// (`alice`, `@ml-infer`); a name NSS does not know gets no entry.
pub fn write(root: &Root, team: &str, content: &str, readers: &[String]) -> Result<(), FileError> {
    let path = file(root, team);
    write_atomic(&path, content.as_bytes())?;
    let (users, groups) = resolve(readers);
    restrict(&path, &users, &groups)
}

/// Member names to uids and gids through NSS, sorted (the ACL's order).
fn resolve(readers: &[String]) -> (Vec<u32>, Vec<u32>) {
    use nix::unistd::{Group, User};
    let (mut users, mut groups) = (Vec::new(), Vec::new());
    for r in readers {
        match r.strip_prefix('@') {
            Some(g) => groups.extend(Group::from_name(g).ok().flatten().map(|g| g.gid.as_raw())),
            None => users.extend(User::from_name(r).ok().flatten().map(|u| u.uid.as_raw())),
        }
    }
    users.sort_unstable();
    users.dedup();
    groups.sort_unstable();
    groups.dedup();
    (users, groups)
}

/// `system.posix_acl_access` for owner rw, each of `users` and `groups` read, the owning group
/// and others nothing: the kernel's xattr format (version 2, then `tag, perm, id` entries in tag
/// and id order; `acl(5)`).
fn acl_xattr(users: &[u32], groups: &[u32]) -> Vec<u8> {
    const UNDEFINED: u32 = u32::MAX;
    let mut e: Vec<(u16, u16, u32)> = vec![(0x01, 6, UNDEFINED)];
    e.extend(users.iter().map(|&u| (0x02, 4, u)));
    e.push((0x04, 0, UNDEFINED));
    e.extend(groups.iter().map(|&g| (0x08, 4, g)));
    e.push((0x10, 4, UNDEFINED));
    e.push((0x20, 0, UNDEFINED));
    let mut out = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in e {
        out.extend(tag.to_le_bytes());
        out.extend(perm.to_le_bytes());
        out.extend(id.to_le_bytes());
    }
    out
}

/// Mode 0640 (0600 without readers) and the readers' ACL. A file system without ACLs leaves the
/// spec to root: failing closed, a member's engine does not find it rather than everyone's.
fn restrict(path: &std::path::Path, users: &[u32], groups: &[u32]) -> Result<(), FileError> {
    use std::os::unix::fs::PermissionsExt;
    let err = |e| FileError::new(path, e);
    let mode = |m| std::fs::set_permissions(path, std::fs::Permissions::from_mode(m));
    if users.is_empty() && groups.is_empty() {
        return mode(0o600).map_err(err);
    }
    let value = acl_xattr(users, groups);
    let name = c"system.posix_acl_access";
    let c_path = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()))
        .map_err(|_| err(std::io::ErrorKind::InvalidInput.into()))?;
    // SAFETY: both strings are NUL-terminated and outlive the call; `value` is a live buffer of
    // the length passed.
    let rc = unsafe {
        nix::libc::setxattr(
            c_path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    mode(0o600).map_err(err)?;
    tracing::warn!(
        "{}: no ACL for the team's members ({e}); readable by root only",
        path.display()
    );
    Ok(())
}

/// Who the ACL of `team`'s spec lets read it, as the policy names members: `alice` for a user
/// entry, `@ml-infer` for a group entry (`#1234`, `@#1234` for an id NSS does not name). Empty
/// without a spec or an ACL. The plan rewrites a spec that someone outside the team can read.
pub fn readers(root: &Root, team: &str) -> Vec<String> {
    let path = file(root, team);
    let Ok(c_path) =
        std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()))
    else {
        return Vec::new();
    };
    let mut buf = [0u8; 4096];
    // SAFETY: both strings are NUL-terminated and outlive the call; `buf` is a live buffer of
    // the length passed.
    let n = unsafe {
        nix::libc::getxattr(
            c_path.as_ptr(),
            c"system.posix_acl_access".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    let Ok(n) = usize::try_from(n) else {
        return Vec::new();
    };
    acl_names(
        &buf[..n],
        &|uid| {
            nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
                .ok()
                .flatten()
                .map(|u| u.name)
        },
        &|gid| {
            nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid))
                .ok()
                .flatten()
                .map(|g| g.name)
        },
    )
}

/// The user and group entries of an ACL in the kernel's xattr format, named as in the policy.
fn acl_names(
    x: &[u8],
    user: &dyn Fn(u32) -> Option<String>,
    group: &dyn Fn(u32) -> Option<String>,
) -> Vec<String> {
    if x.len() < 4 || x[..4] != 2u32.to_le_bytes() {
        return Vec::new();
    }
    x[4..]
        .chunks_exact(8)
        .filter_map(|c| {
            let tag = u16::from_le_bytes([c[0], c[1]]);
            let id = u32::from_le_bytes([c[4], c[5], c[6], c[7]]);
            match tag {
                0x02 => Some(user(id).unwrap_or_else(|| format!("#{id}"))),
                0x08 => Some(format!(
                    "@{}",
                    group(id).unwrap_or_else(|| format!("#{id}"))
                )),
                _ => None,
            }
        })
        .collect()
}

/// Remove a team's spec (team gone from the policy); a missing file is fine.
pub fn remove(root: &Root, team: &str) -> Result<(), FileError> {
    remove_if_exists(&file(root, team)).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_round_trip_through_files_and_ignore_other_vendors() {
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        write(&root, "infer", "{}\n", &[]).unwrap();
        std::fs::write(root.join("/var/run/cdi/nvidia.com-gpu.yaml"), "x").unwrap();
        std::fs::write(root.join("/var/run/cdi/gpuctl.io-team-Bad.json"), "x").unwrap();
        let got = read_all(&root).unwrap();
        assert_eq!(got.keys().map(|t| &**t).collect::<Vec<_>>(), ["infer"]);
        assert_eq!(got["infer"], "{}\n");
        remove(&root, "infer").unwrap();
        remove(&root, "infer").unwrap();
        assert!(read_all(&root).unwrap().is_empty());
        assert!(root.join("/var/run/cdi/nvidia.com-gpu.yaml").exists());
    }

    #[test]
    fn a_spec_is_not_for_others_and_a_world_readable_one_is_rewritten() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        // root is always known to NSS: an ACL entry for uid 0 and gid 0, or 0600 where the
        // temp dir's file system has no ACLs.
        write(&root, "infer", "{}\n", &["root".into(), "@root".into()]).unwrap();
        let mode = std::fs::metadata(file(&root, "infer"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o007, 0, "{mode:o}");
        assert!(read_all(&root).unwrap().contains_key("infer"));
        std::fs::set_permissions(file(&root, "infer"), std::fs::Permissions::from_mode(0o644))
            .unwrap();
        assert!(read_all(&root).unwrap().is_empty());
    }

    #[test]
    fn acl_entries_read_back_as_the_policy_names_members() {
        let x = acl_xattr(&[1000, 1001], &[2000]);
        let user = |u: u32| (u == 1000).then(|| "alice".to_string());
        let group = |g: u32| (g == 2000).then(|| "ml-infer".to_string());
        assert_eq!(
            acl_names(&x, &user, &group),
            ["alice", "#1001", "@ml-infer"]
        );
        assert!(acl_names(&[], &user, &group).is_empty());
        assert!(
            acl_names(&[1, 0, 0, 0, 2, 0], &user, &group).is_empty(),
            "not version 2"
        );
    }

    #[test]
    fn acl_entries_in_the_kernels_order() {
        let x = acl_xattr(&[1000], &[2000, 2001]);
        assert_eq!(&x[..4], &[2, 0, 0, 0]);
        let tags: Vec<u16> = x[4..]
            .chunks(8)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(tags, [0x01, 0x02, 0x04, 0x08, 0x08, 0x10, 0x20]);
        let ids: Vec<u32> = x[4..]
            .chunks(8)
            .map(|c| u32::from_le_bytes([c[4], c[5], c[6], c[7]]))
            .collect();
        assert_eq!(ids[1], 1000);
        assert_eq!(&ids[3..5], &[2000, 2001]);
    }
}
