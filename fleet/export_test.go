package fleet

// SetWarmPage sets how many nodes a warm-up reads at a time; call it before
// the service's first warm-up.
func SetWarmPage(s *Service, n int) { s.warmPage = n }
