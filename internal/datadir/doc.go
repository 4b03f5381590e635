// Package datadir makes a data dir belong to one process at a time. [Acquire] takes an
// exclusive, non-blocking flock(2) on the file LOCK in the dir and records who holds it
// there; a second dispenser started on the same --data-dir gets an [*InUseError] at once
// that names the holder's PID, node ID and host, instead of serving IDs out of the same
// JetStream files as the first (issue 16: two dispensers on one dir handed out 300 IDs
// twice).
//
// It is the LOCK file of LevelDB and RocksDB, and what flock(1) does for a cron job:
// the lock is a kernel lock on an open file, and the file itself is only a place to
// take it and a note for the operator.
//
// # Why flock, and not the usual alternatives
//
//   - A PID file that a starting process checks ("is PID 1234 alive?") is wrong both
//     ways: PIDs are reused, after a reboot and constantly in containers where every
//     dispenser is PID 1, so a dead holder can look alive; and check-then-write is a race
//     between two processes that start together.
//   - A file created with O_CREATE|O_EXCL, whose existence is the lock, outlives its
//     holder: kill -9, the OOM killer or a power cut leave it behind and the restart is
//     refused until someone deletes it by hand. Operators who learn to delete it will one
//     day delete it under a live holder.
//   - flock is released by the kernel when the last descriptor of the open file is
//     closed, which covers every way a process can end. A stale lock cannot exist: the
//     next Acquire after a crash succeeds at once and overwrites the dead holder's note.
//     LOCK_NB makes a conflict an immediate refusal rather than a wait.
//
// # What to know about the lock
//
//   - It belongs to the open file description, not to the process: two Acquire calls in
//     one process conflict like two processes do. (fcntl record locks are per process,
//     would let both succeed, and are dropped when the process closes any descriptor of
//     the file; that is why this package does not use them.)
//   - The descriptor is close-on-exec, so a child process started by the holder does not
//     inherit the lock and keep it after the holder dies.
//   - A [Lock] that is dropped without [Lock.Release] stays held until the process ends;
//     the package keeps every held Lock reachable so that the garbage collector cannot
//     close its file and release the dir behind the caller's back.
//   - LOCK is never removed, not even by Release. Removing it would let a process that
//     opened the old file just before the removal lock it while a third one creates and
//     locks a new file of the same name: two holders. Acquire also checks, once it holds
//     the lock, that the name LOCK still refers to the file it locked, and starts again
//     if it does not. Do not delete LOCK by hand; there is never a reason to.
//   - The lock is on the file, not on the path: a dir reached through a symbolic link or
//     a bind mount is the same dir.
//   - The note in LOCK is one line of JSON ([Holder]), written after the lock is held and
//     cleared by Release. It is information, never the lock: a refused Acquire reads it to
//     name the holder. A dir whose LOCK is full of stale text is not locked.
//   - Keep data dirs on a local file system. Linux emulates flock on NFS with the
//     server's record locks, which works only while the lock daemon does; other network
//     file systems may not lock across machines at all.
//
// flock(2) is used on Linux, macOS and the BSDs. Elsewhere (Windows, Solaris, illumos,
// AIX, Plan 9) Acquire returns an error that wraps [errors.ErrUnsupported]: a dispenser
// that cannot lock its dir does not start.
package datadir
