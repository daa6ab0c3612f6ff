//! The cron expression of `backup.schedule.cron`, read one way by the webhook (which refuses a
//! bad one, naming the field) and the data-handler (which takes the backups).

use croner::Cron;
use croner::parser::{CronParser, Seconds};
use k8s_openapi::jiff::Timestamp;
use k8s_openapi::jiff::tz::TimeZone;

/// A parsed five-field cron expression, evaluated in UTC.
#[derive(Debug, Clone)]
pub struct Schedule(Cron);

impl Schedule {
    /// Parses `expression`; the error says what is allowed. An expression no date matches
    /// (`0 0 30 2 *`, 30 February) is refused too: it would never take a backup.
    pub fn parse(expression: &str) -> Result<Schedule, String> {
        let schedule = CronParser::builder()
            .seconds(Seconds::Disallowed)
            .build()
            .parse(expression)
            .map(Schedule)
            .map_err(|error| {
                format!(
                    "{expression:?} is not a cron expression ({error}); use five fields in UTC: \
                     minute hour day-of-month month day-of-week, e.g. \"0 2 * * *\" for 02:00 \
                     every day"
                )
            })?;
        // Dates repeat within 28 years, weekdays included; any start before now will do.
        let start = Timestamp::from_second(946_684_800).unwrap_or(Timestamp::UNIX_EPOCH);
        match schedule.next_after(start) {
            Some(_) => Ok(schedule),
            None => Err(format!(
                "{expression:?} matches no date, so it would never take a backup; check the \
                 day of month against the month (e.g. 30 February)"
            )),
        }
    }

    /// The first scheduled time strictly after `after`; `None` when the expression never
    /// matches again (e.g. 30 February).
    pub fn next_after(&self, after: Timestamp) -> Option<Timestamp> {
        self.0
            .find_next_occurrence(&after.to_zoned(TimeZone::UTC), false)
            .ok()
            .map(|zoned| zoned.timestamp())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    #[test]
    fn a_daily_schedule_is_due_at_its_hour_in_utc() {
        let daily = Schedule::parse("0 2 * * *").unwrap();
        assert_eq!(
            daily.next_after(at("2026-11-27T01:59:59Z")),
            Some(at("2026-11-27T02:00:00Z"))
        );
        assert_eq!(
            daily.next_after(at("2026-11-27T02:00:00Z")),
            Some(at("2026-11-28T02:00:00Z")),
            "strictly after"
        );
        let every_minute = Schedule::parse("* * * * *").unwrap();
        assert_eq!(
            every_minute.next_after(at("2026-11-27T10:00:30Z")),
            Some(at("2026-11-27T10:01:00Z"))
        );
    }

    #[test]
    fn a_bad_expression_is_refused_with_what_is_allowed() {
        for bad in [
            "",
            "0 2 * *",
            "0 0 2 * * *",
            "61 * * * *",
            "every day",
            "0 2 * * MON-",
        ] {
            let error = Schedule::parse(bad).expect_err(bad);
            assert!(error.contains("five fields in UTC"), "{bad}: {error}");
        }
        assert!(Schedule::parse("30 3 * * SUN").is_ok());
        let never = Schedule::parse("0 0 30 2 *").unwrap_err();
        assert!(never.contains("matches no date"), "{never}");
        assert!(Schedule::parse("0 0 29 2 *").is_ok(), "leap days come");
        assert!(Schedule::parse("*/15 * * * *").is_ok());
    }

    #[test]
    fn an_expression_that_never_matches_has_no_next_time() {
        // `parse` refuses it; a stored one (written before that check) still yields no time.
        let cron = CronParser::builder()
            .seconds(Seconds::Disallowed)
            .build()
            .parse("0 0 30 2 *")
            .unwrap();
        assert_eq!(Schedule(cron).next_after(at("2026-11-27T00:00:00Z")), None);
    }
}
