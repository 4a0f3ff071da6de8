// A stand-in for Android's android.content.Context, which gobind's go.Seq names in
// Seq.setContext: enough for javac on a machine without the Android SDK. TestJava never calls
// setContext.
package android.content;

public class Context {}
