//! Where `tender serve` writes its log: standard error, with the access log batched. An
//! access line goes into a buffer that a flusher thread writes out at most `BATCH_DELAY` after
//! the first line of a batch (or at once when the buffer reaches `BATCH_BYTES`), so a busy
//! server makes one write for many requests instead of one each. Any other line (a warning,
//! a fill that ended) is written at once, after the access lines before it, so the order of
//! lines is the order of events. [`flush`] writes what is buffered (at exit).

use std::io::Write;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tracing_subscriber::fmt::MakeWriter;

/// How long the first line of a batch may wait.
const BATCH_DELAY: Duration = Duration::from_millis(2);
/// A buffer this full is written at once, by the writer that filled it.
const BATCH_BYTES: usize = 64 * 1024;

/// The log's destination: standard error.
pub struct Sink {
    state: Mutex<State>,
    wake: Condvar,
}

struct State {
    buf: Vec<u8>,
    /// The flusher was asked to write the buffer.
    pending: bool,
}

static SINK: Sink = Sink { state: Mutex::new(State { buf: Vec::new(), pending: false }), wake: Condvar::new() };
/// Whether the flusher thread runs (without it every line is written at once).
static FLUSHER: OnceLock<bool> = OnceLock::new();

/// The process's log sink; its flusher thread starts with the first use.
pub fn sink() -> &'static Sink {
    FLUSHER.get_or_init(|| {
        match std::thread::Builder::new().name("tender-log".into()).spawn(|| SINK.run()) {
            Ok(_) => true,
            Err(e) => {
                eprintln!("tender: log flusher not started ({e}); writing every line at once");
                false
            }
        }
    });
    &SINK
}

/// Write what is buffered now (before the process exits).
pub fn flush() {
    SINK.write_out(&mut SINK.lock());
}

impl Sink {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Write the buffer out. Done under the lock: lines reach the file in order.
    fn write_out(&self, st: &mut State) {
        st.pending = false;
        if !st.buf.is_empty() {
            let _ = std::io::stderr().lock().write_all(&st.buf);
            st.buf.clear();
        }
    }

    fn run(&self) {
        loop {
            {
                let mut st = self.lock();
                while !st.pending {
                    st = self.wake.wait(st).unwrap_or_else(|p| p.into_inner());
                }
            }
            // Let a burst gather into one write.
            std::thread::sleep(BATCH_DELAY);
            self.write_out(&mut self.lock());
        }
    }
}

/// One log line being written (tracing-subscriber formats a whole event, then writes it):
/// the buffer stays locked from its first byte to its end, so lines never interleave.
pub struct Line {
    batched: bool,
    st: Option<MutexGuard<'static, State>>,
}

impl Write for Line {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.st.get_or_insert_with(|| SINK.lock()).buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        let Some(st) = self.st.as_mut() else { return };
        if !self.batched || st.buf.len() >= BATCH_BYTES || FLUSHER.get() != Some(&true) {
            SINK.write_out(st);
        } else if !st.pending {
            st.pending = true;
            SINK.wake.notify_one();
        }
    }
}

impl<'a> MakeWriter<'a> for &'static Sink {
    type Writer = Line;

    fn make_writer(&'a self) -> Line {
        Line { batched: false, st: None }
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Line {
        Line { batched: meta.target() == "access", st: None }
    }
}
