"""Plugging a fleet into Prometheus and Grafana: file_sd targets, supervisor metrics, dashboard, scrape config."""
