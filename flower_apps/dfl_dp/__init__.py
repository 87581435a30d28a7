"""Study dfl-dp: centralized FL vs sequential DFL under matched clipping and Gaussian noise."""
