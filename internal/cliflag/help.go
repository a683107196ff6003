package cliflag

import (
	"fmt"
	"io"
	"sort"
)

// WriteHelp writes the settings list of --help, the one shape every
// subcommand shows: each flag on a line of its own (with its --no- form
// where it has one), its usage, default and environment variable on the
// next, under a "[group]" header where entries have groups (groups sorted
// by name, entries in the order they were added); then, under
// "Environment only:", the settings no flag sets. Hidden entries are left
// out, and a secret's default is what help shows, never its value.
func (s *Set) WriteHelp(w io.Writer) {
	var flags, envOnly []*Entry
	for _, e := range s.entries {
		switch {
		case e.Hidden:
		case e.Name != "":
			flags = append(flags, e)
		case e.Env != "":
			envOnly = append(envOnly, e)
		}
	}
	sort.SliceStable(flags, func(i, j int) bool { return flags[i].Group < flags[j].Group })
	fmt.Fprintf(w, "Flags:\n")
	group := ""
	for _, e := range flags {
		if e.Group != group {
			group = e.Group
			fmt.Fprintf(w, "\n  [%s]\n", group)
		}
		line := "  --" + e.Name
		if s.HasNegation(e) {
			line += " / --no-" + e.Name
		}
		fmt.Fprintf(w, "%s\n      %s %s\n", line, e.Usage, helpDefault(e))
	}
	if len(envOnly) > 0 {
		fmt.Fprintf(w, "\nEnvironment only:\n")
		for _, e := range envOnly {
			if e.Usage == "" {
				fmt.Fprintf(w, "  %s (default %s)\n", e.Env, e.Default)
				continue
			}
			fmt.Fprintf(w, "  %s\n      %s (default %s)\n", e.Env, e.Usage, e.Default)
		}
	}
}

// helpDefault is "(default D)" or "(default D; env E)".
func helpDefault(e *Entry) string {
	if e.Env == "" {
		return "(default " + e.Default + ")"
	}
	return "(default " + e.Default + "; env " + e.Env + ")"
}
