#include "transport/host.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <string_view>

#include <fmt/format.h>

namespace shoal {

std::string hostIdentity() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::string bootId;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> bootId;
  struct stat pidNamespace {}, netNamespace {};
  stat("/proc/self/ns/pid", &pidNamespace);
  stat("/proc/self/ns/net", &netNamespace);
  return fmt::format("{}/{}/{}/{}", host, bootId, static_cast<unsigned long>(pidNamespace.st_ino),
                     static_cast<unsigned long>(netNamespace.st_ino));
}

bool processAlive(long pid) {
  std::string path = "/proc/" + std::to_string(pid) + "/stat";
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT || errno == ESRCH) return false;
    return !(kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH);
  }
  char text[512];
  ssize_t n = read(fd, text, sizeof text - 1);
  close(fd);
  if (n <= 0) return n < 0 && errno != ESRCH;  // an exited process's stat reads empty or ESRCH
  std::string_view fields(text, static_cast<size_t>(n));
  // The command is in parentheses and may contain spaces: the state follows the last ')'.
  size_t paren = fields.rfind(')');
  if (paren == std::string_view::npos || paren + 2 >= fields.size()) return true;  // cut short: not proof of death
  char stateChar = fields[paren + 2];
  return stateChar != 'Z' && stateChar != 'X';
}

}  // namespace shoal
