//! The lend windows' local time in a zone other than UTC: its own test binary, because the
//! zone is the process's `TZ` and no other test may read it meanwhile.

use gpuctl::dbus_api::lend::local_time;
use gpuctl::lending::LocalTime;

#[test]
fn windows_are_read_in_the_hosts_zone() {
    // A POSIX zone string needs no tzdata: five and a half hours east of UTC. Then one with
    // summer time (CET/CEST), to see the offset follow the date.
    std::env::set_var("TZ", "IST-5:30");
    // 2025-12-03T17:31:50Z, a Wednesday: 23:01 local.
    let t = 1_764_783_110;
    assert_eq!(
        local_time(t),
        LocalTime {
            weekday: 2,
            minute_of_day: 23 * 60 + 1
        }
    );
    // 18:45Z the same day is 00:15 on Thursday.
    assert_eq!(
        local_time(t + 73 * 60 + 10),
        LocalTime {
            weekday: 3,
            minute_of_day: 15
        }
    );
    std::env::set_var("TZ", "CET-1CEST,M3.5.0,M10.5.0/3");
    // 2026-07-01T12:00:00Z is 14:00 in summer; 2026-01-01T12:00:00Z is 13:00 in winter.
    assert_eq!(local_time(1_782_907_200).minute_of_day, 14 * 60);
    assert_eq!(local_time(1_767_268_800).minute_of_day, 13 * 60);
}
