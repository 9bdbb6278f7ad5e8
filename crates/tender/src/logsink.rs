//! Where `tender serve` writes its log: standard error, with the access log batched. An
//! access line goes into a buffer that a flusher thread writes out at most `BATCH_DELAY` after
//! the first line of a batch (or at once when the buffer reaches `BATCH_BYTES`), so a busy
//! server makes one write for many requests instead of one each. Any other line (a warning,
//! a fill that ended) is written at once, after the access lines before it, so the order of
//! lines is the order of events. [`flush`] writes what is buffered (at exit).

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tracing_subscriber::fmt::MakeWriter;

/// How long the first line of a batch may wait.
const BATCH_DELAY: Duration = Duration::from_millis(2);
/// A buffer this full is written at once, by the writer that filled it.
const BATCH_BYTES: usize = 64 * 1024;

/// The log's destination (standard error in `tender serve`).
pub struct Sink {
    state: Mutex<State>,
    /// The destination, locked while a batch is written: lines are appended to `state`
    /// meanwhile, so a request never waits for the file. Lock order: `state`, then `out`.
    out: Mutex<Out>,
    wake: Condvar,
    /// Whether the flusher thread runs (without it every line is written at once).
    flusher: AtomicBool,
}

struct State {
    buf: Vec<u8>,
    /// The flusher was asked to write the buffer.
    pending: bool,
}

struct Out {
    to: Box<dyn Write + Send>,
    /// The last batch's buffer, cleared: the next buffer lines go into.
    spare: Vec<u8>,
}

static SINK: OnceLock<&'static Sink> = OnceLock::new();

/// The process's log sink, on standard error; its flusher thread starts with the first use.
pub fn sink() -> &'static Sink {
    SINK.get_or_init(|| Sink::start(Box::new(std::io::stderr())))
}

/// Write one whole access line (written directly, not as a tracing event; see
/// `tender_server::access::log_directly`), batched like an access event.
pub fn write_access_line(line: &[u8]) {
    let mut l = Line { sink: sink(), batched: true, st: None };
    let _ = l.write_all(line);
}

/// Write what is buffered now (before the process exits).
pub fn flush() {
    if let Some(s) = SINK.get() {
        s.write_out(s.lock());
    }
}

impl Sink {
    /// A sink writing to `out`, with its flusher thread (it lives as long as the process).
    fn start(out: Box<dyn Write + Send>) -> &'static Sink {
        let sink: &'static Sink = Box::leak(Box::new(Sink {
            state: Mutex::new(State { buf: Vec::new(), pending: false }),
            out: Mutex::new(Out { to: out, spare: Vec::new() }),
            wake: Condvar::new(),
            flusher: AtomicBool::new(false),
        }));
        match std::thread::Builder::new().name("tender-log".into()).spawn(move || sink.run()) {
            Ok(_) => sink.flusher.store(true, Ordering::Release),
            Err(e) => eprintln!("tender: log flusher not started ({e}); writing every line at once"),
        }
        sink
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Write the buffer out. The destination is locked before the buffer is let go of, so
    /// batches reach the file in the order they were taken; the buffer is free again while
    /// the batch is written.
    fn write_out(&self, mut st: MutexGuard<'_, State>) {
        st.pending = false;
        if st.buf.is_empty() {
            return;
        }
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let spare = std::mem::take(&mut out.spare);
        let mut batch = std::mem::replace(&mut st.buf, spare);
        drop(st);
        let Out { to, spare } = &mut *out;
        let _ = to.write_all(&batch).and_then(|()| to.flush());
        batch.clear();
        // A buffer grown by a burst is not kept.
        if batch.capacity() <= 4 * BATCH_BYTES {
            *spare = batch;
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
            self.write_out(self.lock());
        }
    }
}

/// One log line being written (tracing-subscriber formats a whole event, then writes it):
/// the buffer stays locked from its first byte to its end, so lines never interleave.
pub struct Line {
    sink: &'static Sink,
    batched: bool,
    st: Option<MutexGuard<'static, State>>,
}

impl Write for Line {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.st.get_or_insert_with(|| self.sink.lock()).buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        let Some(mut st) = self.st.take() else { return };
        if !self.batched || st.buf.len() >= BATCH_BYTES || !self.sink.flusher.load(Ordering::Acquire) {
            self.sink.write_out(st);
        } else if !st.pending {
            st.pending = true;
            drop(st);
            self.sink.wake.notify_one();
        }
    }
}

impl<'a> MakeWriter<'a> for &'static Sink {
    type Writer = Line;

    fn make_writer(&'a self) -> Line {
        Line { sink: self, batched: false, st: None }
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Line {
        Line { sink: self, batched: meta.target() == "access", st: None }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use std::sync::Arc;

    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn line(sink: &'static Sink, batched: bool, text: &str) {
        let mut l = Line { sink, batched, st: None };
        l.write_all(text.as_bytes()).unwrap();
    }

    #[test]
    fn should_batch_access_lines_and_keep_every_line_in_order() {
        let out = Shared::default();
        let sink = Sink::start(Box::new(out.clone()));
        let text = || String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        line(sink, true, "a1\n");
        line(sink, true, "a2\n");
        // Other lines go at once, after the access lines before them.
        line(sink, false, "warn\n");
        assert_eq!(text(), "a1\na2\nwarn\n");
        line(sink, true, "a3\n");
        // The flusher writes a3 within BATCH_DELAY; bounded wait.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !text().ends_with("a3\n") {
            assert!(std::time::Instant::now() < deadline, "the flusher never wrote a3: {:?}", text());
            std::thread::yield_now();
        }
        assert_eq!(text(), "a1\na2\nwarn\na3\n");
        // A full buffer is written by the line that filled it.
        let big = "x".repeat(BATCH_BYTES) + "\n";
        line(sink, true, &big);
        assert!(text().ends_with(&big), "a full buffer is written at once");
    }

    /// A destination whose writes wait until the test lets them go.
    struct Gate {
        entered: std::sync::mpsc::Sender<()>,
        release: std::sync::mpsc::Receiver<()>,
        out: Shared,
    }

    impl Write for Gate {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            let _ = self.entered.send(());
            let _ = self.release.recv_timeout(Duration::from_secs(30));
            self.out.write(b)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn should_take_access_lines_while_a_slow_write_is_in_progress() {
        let (entered_tx, entered) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel();
        let out = Shared::default();
        let sink = Sink::start(Box::new(Gate { entered: entered_tx, release: release_rx, out: out.clone() }));
        line(sink, true, "a1\n");
        // The flusher is now inside the write of a1, held there.
        entered.recv_timeout(Duration::from_secs(10)).unwrap();
        let (done_tx, done) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            line(sink, true, "a2\n");
            let _ = done_tx.send(());
        });
        // Before the fix the request's line waited for the file write to end.
        assert!(done.recv_timeout(Duration::from_secs(10)).is_ok(), "an access line waited for a write in progress");
        for _ in 0..4 {
            let _ = release.send(());
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while String::from_utf8(out.0.lock().unwrap().clone()).unwrap() != "a1\na2\n" {
            assert!(std::time::Instant::now() < deadline, "lines lost or out of order: {:?}", out.0.lock().unwrap());
            let _ = release.send(());
            std::thread::yield_now();
        }
    }
}
