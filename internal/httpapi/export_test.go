package httpapi

import "time"

// BodyDeadline exposes the server's body read deadline for a limit to the
// external tests.
func BodyDeadline(s *Server, limit int64) time.Duration { return s.bodyDeadline(limit) }

// MaxKVBodyBytes is the server's KV store body limit (Options default
// applied).
func MaxKVBodyBytes(s *Server) int64 { return s.opts.MaxKVBodyBytes }

// The body limits of the route table, by name.
const (
	MaxSmallBody  = maxSmallBody
	MaxJSONBody   = maxJSONBody
	MaxScriptForm = maxScriptForm
)

// OnBudgetAcquired makes the server built from o call f (with the bytes
// taken) after every reservation of the KV body budget.
func OnBudgetAcquired(o *Options, f func(n int64)) { o.budgetHook = f }
