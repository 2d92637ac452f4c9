// The one mark of a C API entry point: C linkage, visible outside libshoal.so
// (everything else is hidden by -fvisibility=hidden).
#pragma once

#define SHOAL_EXPORT extern "C" __attribute__((visibility("default")))
