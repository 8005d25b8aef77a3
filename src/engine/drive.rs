//! The one driver of the core's machines (`core::machine`): a recovery
//! pass, an upgrade, a provision and a deprovision all run through
//! [`drive`]. It sequences their commands through a [`Performer`], checks
//! the mandate (the lease and the instance lock) right before every effect
//! (T2, T3), counts every port's failure, and sleeps out a machine's
//! waits; it decides nothing.

use crate::core::machine::{Abandon, Machine, MachineAnswer, MachineCommand};
use crate::core::types::Timestamp;
use crate::ports::Clock;

use super::{count_port_failure, time_until};

/// Performs a machine's commands through the ports.
pub(crate) trait Performer<M: Machine> {
    /// Performs `command`; `machine` is there to be read (what a log line
    /// says the command was for), never changed.
    async fn perform(&mut self, machine: &M, command: &M::Command) -> M::Answer;

    /// After `command` was answered (its port's failure counted), before
    /// the machine hears it with `now`, the very instant it is handed: a
    /// log line, a record for a watcher (a flight recording replays it).
    fn performed(&mut self, command: M::Command, answer: &M::Answer, now: Timestamp) {
        let _ = (command, answer, now);
    }
}

/// Drives `machine` until it is done. An effect is issued only while
/// `trusted()` says the mandate holds; otherwise the machine is told
/// [`Abandon::MandateLost`] and goes on with what it still asks for (no
/// effect: an instance's state put back), if anything. Returns why the
/// machine was abandoned, if it was. A deadline is the caller's: it drops
/// this future and abandons the machine itself.
pub(crate) async fn drive<M, P>(
    machine: &mut M,
    performer: &mut P,
    clock: &dyn Clock,
    mut trusted: impl FnMut() -> bool,
) -> Option<Abandon>
where
    M: Machine,
    P: Performer<M>,
{
    let mut abandoned = None;
    loop {
        if let Some(command) = machine.poll_command() {
            // Checked with no await before the effect is issued: a process
            // paused past its mandate stops here instead of acting.
            if command.is_effect() && !trusted() {
                machine.abandon(Abandon::MandateLost);
                abandoned.get_or_insert(Abandon::MandateLost);
                continue;
            }
            let answer = performer.perform(machine, &command).await;
            if let Some((port, kind)) = answer.port_failure() {
                count_port_failure(port, kind);
            }
            // One reading of the clock: what a watcher records is what
            // the machine was handed.
            let now = clock.now();
            performer.performed(command, &answer, now);
            machine.handle(answer, now);
        } else if let Some(at) = machine.poll_timeout() {
            // The machine waits until the instant it names, on the one
            // clock it is given.
            tokio::time::sleep(time_until(at, clock.now())).await;
            machine.handle_timeout(clock.now());
        } else {
            return abandoned;
        }
    }
}
