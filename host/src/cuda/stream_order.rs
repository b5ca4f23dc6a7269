//! Ordering work on several streams around one allocation, without an event per use.
//!
//! cudarc can record an event on every use of every buffer (its event tracking). opsmith turns
//! that off and tracks uses itself, per allocation: which stream wrote it last and which other
//! streams have read it since. On one stream, which is the common case, a use then costs no
//! driver call at all. A read from another stream waits for the writer (through an event
//! recorded on the writer's stream at that moment, which covers the write and whatever that
//! stream queued after it: never too short a wait, only sometimes a longer one) and records an
//! event of its own, which a later write, or the free, waits for. Readers are held by their
//! events and a weak reference, so a tensor read from many short-lived streams does not keep
//! them alive (nor their cuBLAS handles).
use super::Stream;
use crate::Result;
use cudarc::driver::{CudaEvent, CudaStream};
use parking_lot::Mutex;
use std::sync::{Arc, Weak};

/// The streams that have used one device allocation: see the module docs.
pub(crate) struct StreamUses {
    /// The stream the memory was allocated on, which frees it.
    home: Stream,
    state: Mutex<Uses>,
}

struct Uses {
    /// The stream of the last write (at first, the stream the memory was allocated on: memory
    /// from a stream-ordered allocator is usable in that stream's order).
    writer: Stream,
    /// Streams other than `writer` that have read since the last write (and waited for it),
    /// each with an event recorded after its latest read. The weak reference only identifies
    /// the stream: while it is held, no new stream can have the same address.
    readers: Vec<(Weak<CudaStream>, CudaEvent)>,
}

/// Whether the reader handle `reader` refers to `stream`: the same stream object, compared by
/// address without upgrading the weak reference (see [`Uses::readers`] for why that is sound).
fn refers_to(reader: &Weak<CudaStream>, stream: &Stream) -> bool {
    std::ptr::eq(reader.as_ptr(), Arc::as_ptr(stream.raw()))
}

impl StreamUses {
    /// An allocation made on `home`.
    pub(crate) fn new(home: &Stream) -> Self {
        Self { home: home.clone(), state: Mutex::new(Uses { writer: home.clone(), readers: Vec::new() }) }
    }

    /// Whether the memory was allocated on its device's default stream.
    pub(crate) fn home_is_default(&self) -> bool {
        self.home.device().is_default_stream(&self.home)
    }

    /// `Err(Error::Capture)` naming `op` unless `stream`, which is capturing a graph, can use
    /// the memory without waiting for another stream: a graph records one stream's work, and a
    /// wait for an event recorded outside it cannot be part of it.
    pub(crate) fn check_capturable(&self, op: &'static str, stream: &Stream, write: bool) -> Result<()> {
        let uses = self.state.lock();
        let how = if !uses.writer.same_as(stream) {
            "written"
        } else if write && !uses.readers.is_empty() {
            "read"
        } else {
            return Ok(());
        };
        Err(crate::Error::Capture {
            op,
            reason: format!(
                "an operand was last {how} on another stream than the capturing {stream:?}, and a graph records \
                 one stream's work: make or overwrite the operand on the capturing stream before the capture"
            ),
        })
    }

    /// Orders the work `stream` queues next after the last write. Call
    /// [`read_done`](Self::read_done) once that work is queued.
    pub(crate) fn read_on(&self, stream: &Stream) -> Result<()> {
        let uses = self.state.lock();
        if uses.writer.same_as(stream) || uses.readers.iter().any(|(r, _)| refers_to(r, stream)) {
            return Ok(());
        }
        stream.wait_for_now(&uses.writer)
    }

    /// Notes a read queued on `stream` (after [`read_on`](Self::read_on)), so that a later write
    /// or the free waits for it.
    pub(crate) fn read_done(&self, stream: &Stream) -> Result<()> {
        let mut uses = self.state.lock();
        if uses.writer.same_as(stream) {
            return Ok(());
        }
        let record = |event: &CudaEvent| {
            event.record(stream.raw()).map_err(|source| stream.device().driver_error("cuEventRecord", source))
        };
        if let Some((_, event)) = uses.readers.iter().find(|(r, _)| refers_to(r, stream)) {
            return record(event);
        }
        let event = stream
            .device()
            .context()
            .new_event(None)
            .map_err(|source| stream.device().driver_error("cuEventCreate", source))?;
        record(&event)?;
        uses.readers.push((Arc::downgrade(stream.raw()), event));
        Ok(())
    }

    /// Orders the work `stream` queues next after the last write and every read since, and
    /// notes the write.
    pub(crate) fn write_on(&self, stream: &Stream) -> Result<()> {
        let mut uses = self.state.lock();
        if !uses.writer.same_as(stream) {
            stream.wait_for_now(&uses.writer)?;
        }
        for (_, event) in uses.readers.iter().filter(|(r, _)| !refers_to(r, stream)) {
            stream.wait_event(event)?;
        }
        uses.readers.clear();
        uses.writer = stream.clone();
        Ok(())
    }

    /// Orders the stream the memory was allocated on, which frees it, after every use on
    /// another stream, so that the memory is not reused while they still read or write it.
    /// Errors are kept on the context (a destructor cannot return them) and reported by its next
    /// checked call.
    pub(crate) fn before_free(&self) {
        let home = &self.home;
        let uses = self.state.lock();
        let context = home.device().context();
        if !uses.writer.same_as(home) {
            context.record_err(home.wait_raw(&uses.writer));
        }
        for (_, event) in uses.readers.iter().filter(|(r, _)| !refers_to(r, home)) {
            context.record_err(home.raw().wait(event));
        }
    }
}
