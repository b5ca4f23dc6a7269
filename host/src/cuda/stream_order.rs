//! Ordering work on several streams around one allocation, without an event per use.
//!
//! cudarc can record an event on every use of every buffer (its event tracking). opsmith turns
//! that off and tracks uses itself, per allocation: which stream wrote it last and which other
//! streams have read it since. On one stream, which is the common case, a use then costs no
//! driver call at all; only a use from a second stream records an event (on the stream it must
//! wait for, at that moment) and waits for it. An event recorded later than the use it stands
//! for covers that use and whatever the stream queued after it, so the wait is never too short,
//! only sometimes longer than needed.
use super::Stream;
use crate::Result;
use parking_lot::Mutex;

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
    /// Streams other than `writer` that have read since the last write and waited for it.
    readers: Vec<Stream>,
}

impl StreamUses {
    /// An allocation made on `home`.
    pub(crate) fn new(home: &Stream) -> Self {
        Self { home: home.clone(), state: Mutex::new(Uses { writer: home.clone(), readers: Vec::new() }) }
    }

    /// Orders the work `stream` queues next after the last write, and notes the read.
    pub(crate) fn read_on(&self, stream: &Stream) -> Result<()> {
        let mut uses = self.state.lock();
        if uses.writer.same_as(stream) || uses.readers.iter().any(|r| r.same_as(stream)) {
            return Ok(());
        }
        stream.wait_for_now(&uses.writer)?;
        uses.readers.push(stream.clone());
        Ok(())
    }

    /// Orders the work `stream` queues next after the last write and every read since, and
    /// notes the write.
    pub(crate) fn write_on(&self, stream: &Stream) -> Result<()> {
        let mut uses = self.state.lock();
        if !uses.writer.same_as(stream) {
            stream.wait_for_now(&uses.writer)?;
        }
        for reader in uses.readers.iter().filter(|r| !r.same_as(stream)) {
            stream.wait_for_now(reader)?;
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
        let others = std::iter::once(&uses.writer).chain(&uses.readers).filter(|s| !s.same_as(home));
        for other in others {
            home.device().context().record_err(home.wait_raw(other));
        }
    }
}
