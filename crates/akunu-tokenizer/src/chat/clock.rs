//! `strftime_now(format)` for templates that put today's date in the system prompt.
//!
//! Only the calendar is needed, so it is computed from the Unix time rather than taken from a
//! date crate. The time is UTC: the process has no portable way to learn its local offset
//! without one, and a prompt's date is at most a day off. The conversions are the ones glibc
//! and Python document for the C locale; anything else is copied through, as glibc does.

use std::time::{SystemTime, UNIX_EPOCH};

const DAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// Seconds since the Unix epoch now (negative before it, which only a broken clock gives).
pub(crate) fn now_unix() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

/// A UTC instant broken down into calendar fields.
struct Civil {
    year: i64,
    /// 1..=12
    month: u32,
    /// 1..=31
    day: u32,
    /// 0 = Sunday
    weekday: u32,
    /// 1..=366
    yday: u32,
    hour: u32,
    minute: u32,
    second: u32,
}

fn is_leap(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn civil(unix: i64) -> Civil {
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400) as u32;
    // Count in 400-year eras starting 0000-03-01, so the leap day ends each year.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    const CUMULATIVE: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = CUMULATIVE[month as usize - 1] + day + u32::from(month > 2 && is_leap(year));
    Civil {
        year,
        month,
        day,
        // 1970-01-01 was a Thursday.
        weekday: (days + 4).rem_euclid(7) as u32,
        yday,
        hour: secs / 3_600,
        minute: secs / 60 % 60,
        second: secs % 60,
    }
}

/// `strftime(format)` of the UTC time `unix`.
pub(crate) fn strftime(format: &str, unix: i64) -> String {
    let t = civil(unix);
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        // glibc's `-` flag drops the padding (`%-d` gives `5`, not `05`).
        let pad = if chars.peek() == Some(&'-') {
            chars.next();
            false
        } else {
            true
        };
        let Some(spec) = chars.next() else {
            out.push('%');
            break;
        };
        let num = |out: &mut String, v: i64, width: usize, fill: char| {
            let s = v.to_string();
            if pad {
                out.extend(std::iter::repeat_n(fill, width.saturating_sub(s.len())));
            }
            out.push_str(&s);
        };
        let hour12 = i64::from((t.hour + 11) % 12 + 1);
        match spec {
            'Y' => out.push_str(&t.year.to_string()),
            'y' => num(&mut out, t.year.rem_euclid(100), 2, '0'),
            'C' => num(&mut out, t.year.div_euclid(100), 2, '0'),
            'm' => num(&mut out, i64::from(t.month), 2, '0'),
            'd' => num(&mut out, i64::from(t.day), 2, '0'),
            'e' => num(&mut out, i64::from(t.day), 2, ' '),
            'j' => num(&mut out, i64::from(t.yday), 3, '0'),
            'H' => num(&mut out, i64::from(t.hour), 2, '0'),
            'I' => num(&mut out, hour12, 2, '0'),
            'M' => num(&mut out, i64::from(t.minute), 2, '0'),
            'S' => num(&mut out, i64::from(t.second), 2, '0'),
            'p' => out.push_str(if t.hour < 12 { "AM" } else { "PM" }),
            'u' => num(&mut out, i64::from((t.weekday + 6) % 7 + 1), 1, '0'),
            'w' => num(&mut out, i64::from(t.weekday), 1, '0'),
            'A' => out.push_str(DAYS[t.weekday as usize]),
            'a' => out.push_str(&DAYS[t.weekday as usize][..3]),
            'B' => out.push_str(MONTHS[t.month as usize - 1]),
            'b' | 'h' => out.push_str(&MONTHS[t.month as usize - 1][..3]),
            'F' => out.push_str(&strftime("%Y-%m-%d", unix)),
            'D' => out.push_str(&strftime("%m/%d/%y", unix)),
            'T' => out.push_str(&strftime("%H:%M:%S", unix)),
            'R' => out.push_str(&strftime("%H:%M", unix)),
            'n' => out.push('\n'),
            't' => out.push('\t'),
            '%' => out.push('%'),
            other => {
                out.push('%');
                if !pad {
                    out.push('-');
                }
                out.push(other);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_dates() {
        // 2024-07-26 13:25:09 UTC, a Friday, day 208 of a leap year.
        let t = 1_722_000_309;
        assert_eq!(strftime("%d %b %Y", t), "26 Jul 2024");
        assert_eq!(strftime("%Y-%m-%d", t), "2024-07-26");
        assert_eq!(
            strftime("%A %B %-d, %y %H:%M:%S %j %p %I %%", t),
            "Friday July 26, 24 13:25:09 208 PM 01 %"
        );
        assert_eq!(
            strftime("%F %T %a %u %w %e", t),
            "2024-07-26 13:25:09 Fri 5 5 26"
        );
        assert_eq!(strftime("%Q %", t), "%Q %");
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", 0), "1970-01-01 00:00:00");
        assert_eq!(
            strftime("%Y-%m-%d %a %j", 951_782_400),
            "2000-02-29 Tue 060"
        );
        assert_eq!(strftime("%Y-%m-%d %a", -86_400), "1969-12-31 Wed");
        assert_eq!(strftime("%Y-%m-%d %j", 1_735_603_200), "2024-12-31 366");
    }
}
