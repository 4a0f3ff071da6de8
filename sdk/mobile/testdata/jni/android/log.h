/* A stand-in for the Android NDK's <android/log.h>, which gobind's JNI glue includes (and links
 * with -llog): TestJava builds that glue for this machine's JDK, where the log lines go to
 * stderr. */
#ifndef ROOMCAST_STUB_ANDROID_LOG_H
#define ROOMCAST_STUB_ANDROID_LOG_H

#include <stdarg.h>
#include <stdio.h>

#define ANDROID_LOG_INFO 4
#define ANDROID_LOG_FATAL 7

static inline int __android_log_print(int prio, const char *tag, const char *fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "%s: ", tag);
	int n = vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	return n;
}

#endif
