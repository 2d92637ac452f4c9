// What a transport needs to know about the processes of its peers on this
// host: which peers share it, and whether a peer's process still runs.
#pragma once

#include <string>

namespace shoal {

// Identifies this host, PID namespace and network namespace: peers with the
// same identity share memory and see each other's /proc entries. Ranks in
// different network namespaces (emulated hosts, bench/netns) count as
// different hosts, so their traffic crosses the emulated network.
std::string hostIdentity();

// False once the process has exited (gone, or a zombie not yet reaped). Only
// an answer from the kernel counts as "gone": when this process cannot open
// /proc/<pid>/stat for lack of descriptors (EMFILE, ENFILE: a flood of
// connections, say) or memory, the peer is taken to be alive, and the
// collective's deadline still bounds the wait.
bool processAlive(long pid);

}  // namespace shoal
