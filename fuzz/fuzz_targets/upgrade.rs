//! `upgrade`: an arbitrary catalog entry (up to three services, each new,
//! behind, or already at the target version) and an arbitrary stream of
//! answers to the overlap replacement's commands. `run_upgrade_and_check`
//! asserts its safety properties (see fuzz/src/upgrade.rs); a violated
//! property or a panic is a crash.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use stead_fuzz::machine::OutcomeSeed;
use stead_fuzz::upgrade::{run_upgrade_and_check, upgrade_input, UpgradeServiceSeed};

/// Answers beyond this many are cycled.
const ANSWERS_MAX: usize = 64;

#[derive(Debug)]
struct Input {
    stopped: bool,
    ready: bool,
    services: Vec<UpgradeServiceSeed>,
    answers: Vec<OutcomeSeed>,
}

impl<'a> Arbitrary<'a> for Input {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let stopped = u.ratio(1, 10)?;
        let ready = u.ratio(4, 5)?;
        let mut services = Vec::new();
        for _ in 0..u.int_in_range(0..=4)? {
            services.push(UpgradeServiceSeed {
                active: u.arbitrary()?,
            });
        }
        let mut answers = Vec::new();
        while answers.len() < ANSWERS_MAX && !u.is_empty() {
            answers.push(OutcomeSeed {
                choice: u.arbitrary()?,
                execution: u.arbitrary()?,
                binds: u.arbitrary()?,
                ..OutcomeSeed::default()
            });
        }
        Ok(Self {
            stopped,
            ready,
            services,
            answers,
        })
    }
}

fuzz_target!(|input: Input| {
    run_upgrade_and_check(
        &upgrade_input(&input.services, input.stopped, input.ready),
        &input.answers,
    );
});
