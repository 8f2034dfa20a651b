//! [`Directory`] backed by NSS (`getpwuid_r`, `getgrnam_r`, `getgrouplist`), so users and
//! groups from LDAP or SSSD count as local ones do.

use super::{Account, Directory};
use nix::unistd::{getgrouplist, Gid, Group, Uid, User};
use std::ffi::CString;

/// The host's NSS.
#[derive(Debug, Clone, Copy, Default)]
pub struct Nss;

impl Directory for Nss {
    fn user_by_uid(&self, uid: u32) -> Option<Account> {
        let u = User::from_uid(Uid::from_raw(uid)).ok().flatten()?;
        Some(Account {
            name: u.name,
            uid,
            gid: u.gid.as_raw(),
            shell: u.shell,
        })
    }

    fn group_gid(&self, name: &str) -> Option<u32> {
        Group::from_name(name)
            .ok()
            .flatten()
            .map(|g| g.gid.as_raw())
    }

    fn groups_of(&self, account: &Account) -> Vec<u32> {
        let Ok(name) = CString::new(account.name.as_str()) else {
            return vec![account.gid];
        };
        getgrouplist(&name, Gid::from_raw(account.gid))
            .map(|v| v.into_iter().map(Gid::as_raw).collect())
            .unwrap_or_else(|_| vec![account.gid])
    }
}
