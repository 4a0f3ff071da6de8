// Package bigroom tests scripts/bigroom.sh, the one command that runs one room of many members
// over as many ChatLink processes as they need on one machine (docs/scale.md): here with a few
// hundred members over three ChatLinks and three bench worker processes. It has no code but its
// test.
package bigroom
